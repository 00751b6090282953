"""The errors of a config and the rules its checks share.

`ConfigError` is a value that is not allowed, said in one line naming the key, the value
and what is allowed; each schema dataclass checks its own node with these helpers
(schema.py), the data node its source's keys (data_checks.py), and checks.py what spans
nodes. `locate` finds the class or function a `_target_` names.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf


class ConfigError(ValueError):
    """A config value that is not allowed; the message is one line for the user."""


class DataError(ConfigError):
    """Data that cannot be read, met while training (a damaged file): the run saves a
    checkpoint at its last optimizer step, then ends with this one line (exit 2)."""

    remedy = "fix the data"

    def after(self, checkpoint: Path | None) -> DataError:
        """This error, its message now saying where training stopped and how to go on."""
        if checkpoint is not None:
            remedy = f"{self.remedy}, then run the same command again to resume"
            self.args = (f"{self}; saved {checkpoint}: {remedy}",)
        return self


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
