"""The error of a config and the rules its checks share (schema.py, targets.py, checks.py).

`ConfigError` is a value that is not allowed, said in one line naming the key, the value
and what is allowed.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import types
import typing
from typing import Any, Literal

from omegaconf import DictConfig, ListConfig, OmegaConf


class ConfigError(ValueError):
    """A config value that is not allowed; the message is one line for the user."""


def is_searchpath(override: str) -> bool:
    """An override of hydra.searchpath: it decides which folders' options compose."""
    return override.lstrip("+~").startswith("hydra.searchpath")


def fail(key: str, value: Any, allowed: str) -> None:
    raise ConfigError(f"{key}={value!r} is not allowed; {allowed}")


# Each helper reads `key` of `node` and names it `prefix + key`: a node's own check passes
# its node and "optimizer.", a check of the whole config the root and "".
def check_choice(node: DictConfig, key: str, choices: tuple[str, ...], prefix: str = "") -> None:
    value = OmegaConf.select(node, key)
    if value not in choices:
        fail(prefix + key, value, "choose one of: " + ", ".join(choices))


def check_switch(
    node: DictConfig, key: str, choices: tuple[bool | str, ...], prefix: str = ""
) -> None:
    """A key that is true, false or a word: "choose true, false or auto"."""
    value = OmegaConf.select(node, key)
    if value not in choices:
        *first, last = (str(c).lower() if isinstance(c, bool) else c for c in choices)
        fail(prefix + key, value, f"choose {', '.join(first)} or {last}")


def check_int(
    node: DictConfig, key: str, minimum: int, optional: bool = False, prefix: str = ""
) -> None:
    value = OmegaConf.select(node, key)
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        extra = " (or null to turn it off)" if optional else ""
        fail(prefix + key, value, f"expected an integer >= {minimum}{extra}")


def check_fields(node: DictConfig, description: type, prefix: str) -> None:
    """Each key of `node` that the dataclass `description` has a field for holds a value of
    the field's type: bool, int, float (an int too), str, list[X], dict[str, X], Literal
    choices, unions of them (X | None); a key it has no field for is left to other checks."""
    hints = typing.get_type_hints(description)
    for field in dataclasses.fields(description):
        if field.name not in node:
            continue
        value = node.get(field.name)
        if isinstance(value, DictConfig | ListConfig):
            value = OmegaConf.to_container(value, resolve=True)
        if not _is_a(value, hints[field.name]):
            from gearshift.config.allowed_types import allowed  # bad input only

            fail(prefix + field.name, value, allowed(_options(hints[field.name])))


def _options(hint: Any) -> tuple[Any, ...]:
    """The types a union joins, or the type itself."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    return typing.get_args(hint) if union else (hint,)


def _is_a(value: Any, hint: Any) -> bool:
    if hint is Any:
        return True
    if len(_options(hint)) > 1:
        return any(_is_a(value, option) for option in _options(hint))
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:  # by type too: True == 1, yet 1 is not the choice True
        return any(value == a and type(value) is type(a) for a in args)
    if origin is list:
        return isinstance(value, list) and all(_is_a(item, args[0]) for item in value)
    if origin is dict:
        return isinstance(value, dict) and all(_is_a(item, args[1]) for item in value.values())
    if hint is type(None):
        return value is None
    if hint in (int, float):  # a bool is an int to Python, not to a config
        return isinstance(value, int | hint) and not isinstance(value, bool)
    return isinstance(value, hint)


def locate(
    key: str, target: Any, expected: str = "expected an importable class or function (module.Name)"
) -> Any:
    """The class or function `target` names ("module.Name"), or a ConfigError for `key`
    that says what is `expected` there."""
    module, _, name = str(target).rpartition(".")
    try:  # not hydra.utils.get_object: it prints its own multi-line error first
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        found = None
    if not callable(found):  # missing, or a module
        raise ConfigError(f"{key}={target!r} is not allowed; {expected}")
    return found


def binds(fn: Any, /, *args: Any, **kwargs: Any) -> bool:
    """Whether `fn(*args, **kwargs)` binds to fn's signature: the quick test a default run's
    nodes pass; where it fails, keyword_checks.py (loaded then) names what is wrong, if
    anything (its checks are the rule)."""
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return False
    return True
