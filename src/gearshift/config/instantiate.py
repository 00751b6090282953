"""Building objects from `_target_` nodes, with bad input reported as one line.

Hydra's own `instantiate` reports a constructor that rejects its arguments as a multi-line
"Error in call to target" with a traceback; here the arguments are bound to the target's
signature first, and any failure becomes a `ConfigError` that names the key.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import hydra
from hydra.errors import InstantiationException
from omegaconf import OmegaConf

from gearshift.config.rules import ConfigError, locate


def accepts(fn: Any, name: str, by_name: bool = False) -> bool:
    """Whether `fn` takes a keyword argument `name` (or, unless `by_name`, any keyword)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature
        return False
    return any(p.name == name or (p.kind is p.VAR_KEYWORD and not by_name) for p in parameters)


def instantiate(key: str, node: Mapping[str, Any], **extra: Any) -> Any:
    """`node["_target_"](**other keys, **extra)`; one-line ConfigError naming `key` when
    the target is missing, rejects the arguments, or raises while building."""
    target = node.get("_target_")
    fn = locate(f"{key}._target_", target)
    kwargs = {k: v for k, v in node.items() if k != "_target_"} | extra
    try:
        inspect.signature(fn).bind(**kwargs)
    except TypeError as error:  # a missing argument is named before an unknown one, as Python does
        if "unexpected keyword" in str(error):
            from gearshift.config.keyword_checks import check_argument_names  # bad input only

            check_argument_names(key, target, fn, kwargs)  # names the keywords it takes
        raise ConfigError(f"{key}._target_={target!r} is not allowed; {error}") from None
    except ValueError:  # no signature to check against: let the call decide
        pass
    try:
        return hydra.utils.instantiate({"_target_": target}, **kwargs, _convert_="all")
    except InstantiationException as error:
        cause = error.__cause__ or error
        if isinstance(cause, ConfigError):  # already one line, naming its own key
            raise cause from None
        first = (str(cause).strip().splitlines() or [""])[0]
        raise ConfigError(
            f"{key}._target_={target!r} could not be built: {type(cause).__name__}: {first}"
        ) from None


def plain(keywords: dict[str, Any]) -> dict[str, Any]:
    """The config's values as torch takes them: lists as tuples (betas)."""
    values = OmegaConf.to_container(OmegaConf.create(keywords)) if keywords else {}
    return {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}


def build(node: str, target: str, first: Any, keywords: dict[str, Any]) -> Any:
    """`cls(first, **keywords)` for the class `target` names; one line naming the node when
    the class rejects a value (its keywords were checked before the run)."""
    cls = locate(f"{node}._target_", target)
    try:
        return cls(first, **keywords)
    except (TypeError, ValueError, RuntimeError) as error:
        line = (str(error).strip().splitlines() or [""])[0]
        raise ConfigError(
            f"{node}._target_={target!r} could not be built: {type(error).__name__}: {line}"
        ) from None
