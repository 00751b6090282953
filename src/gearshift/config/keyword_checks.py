"""A class of one's own and the keywords a node gives a class: the lines that name what is
wrong. Loaded for an optimizer class named in place of a preset's, a scheduler class, or a
node whose keys do not bind to its target's signature (rules.py `binds`: a default run's
nodes pass that quick test, and this module does not load).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

from gearshift.config.rules import ConfigError, fail, locate

# What one's own optimizer class must be (engine/optim.py builds it).
OPTIMIZER_CLASS = "expected an importable torch.optim.Optimizer subclass (module.Name)"


def check_optimizer_class(target: Any) -> None:
    """`optimizer._target_` names a torch.optim.Optimizer subclass, checked by the names of
    its bases (the config layer does not import torch)."""
    found = locate("optimizer._target_", target, OPTIMIZER_CLASS)
    if not isinstance(found, type):
        fail("optimizer._target_", target, OPTIMIZER_CLASS)
    bases = {f"{c.__module__}.{c.__qualname__}" for c in found.__mro__}
    if "torch.optim.optimizer.Optimizer" not in bases:
        fail("optimizer._target_", target, OPTIMIZER_CLASS)


def check_keywords(
    node: str, target: str, keywords: dict[str, Any], given: tuple[str, ...] = ()
) -> None:
    """Every key of `keywords` is a keyword of the class `target` names (after its first
    argument: the parameters, or the optimizer), and each keyword it needs is there or
    among those the loop `given`s; else one line naming the class's keywords."""
    found = locate(f"{node}._target_", target)
    parameters = list(inspect.signature(found).parameters.values())[1:]  # after params/optimizer
    names = [p.name for p in parameters if p.kind is not p.VAR_KEYWORD]
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters)
    for key, value in keywords.items():
        if key not in names and not takes_any:
            fail(
                f"{node}.{key}",
                value,
                f"{target} takes no keyword {key!r}; its keywords: {', '.join(names)}",
            )
    for p in parameters:
        named = p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        if named and p.default is p.empty and p.name not in (*keywords, *given):
            fail(f"{node}.{p.name}", None, f"{target} needs it: ++{node}.{p.name}=VALUE")


def check_argument_names(key: str, target: Any, fn: Any, names: Iterable[str]) -> None:
    """Each of `names` is a keyword argument `fn` takes (the `_target_` of the node `key`);
    else a one-line ConfigError that names the first one it does not and the ones it takes."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature to check against: let the call decide
        return
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return
    takes = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for name in names:
        if name not in takes:
            raise ConfigError(
                f"{key}._target_={target!r} is not allowed; got an unexpected keyword "
                f"argument {name!r}; it takes"
                + (f": {', '.join(takes)}" if takes else " no keyword arguments")
            )
