"""One line for an override of a key its node does not have (`model.delay=0.3`), in place
of OmegaConf's "Key 'delay' is not in struct": the node, the closest keys it has, and how
to add an argument that the node's class accepts (`+model.delay=0.3`). And the hint for a
model or task that reads a key the data lacks (checks.py: model=gpt on image data)."""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from gearshift.config.rules import fail

_LISTED = 12  # keys named when none is close; more would not fit a line
MOVED = {  # old spelling -> the key that took its place
    "data.image_column": "data.fields.inputs",
    "data.label_column": "data.fields.targets",
}


def describe_unknown_key(cause: BaseException, overrides: Sequence[str]) -> str | None:
    """The line for `cause` when it is OmegaConf's unknown key error, else None;
    `overrides` are the command line's, one of which set the key."""
    node = getattr(cause, "parent_node", None)
    key, full_key = getattr(cause, "key", None), getattr(cause, "full_key", None)
    if not isinstance(cause, ConfigAttributeError | ConfigKeyError) or not isinstance(node, DictConfig):  # fmt: skip
        return None
    if not isinstance(key, str) or not isinstance(full_key, str):
        return None
    path = full_key.rpartition(".")[0]
    where = f"the {path} node" if path else "the config"
    given = _setting(full_key, overrides)
    if full_key in MOVED:
        value = given.partition("=")[2]
        return (
            f"{given} is not allowed; the key is now {MOVED[full_key]}: {MOVED[full_key]}={value}"
        )
    keys = sorted(str(k) for k in node)
    line = f"{given} is not allowed; {where} has no key {key!r}; {_closest(key, keys)}"
    if OmegaConf.get_type(node) is not dict:  # a typed node of the schema: its keys are fixed
        return line
    target = node.get("_target_") if "_target_" in keys else None
    if target is None:
        return line
    accepts = _accepts(str(target), key)
    if accepts is False:
        return f"{line}; {target} takes no argument {key!r}"
    return f"{line}; to pass an argument {target} accepts, add it: +{given}"


def _setting(full_key: str, overrides: Sequence[str]) -> str:
    """The override that sets `full_key` or a key below it (`model.delay.x=1`)."""
    for override in overrides:
        key = override.lstrip("+~").partition("=")[0]
        if key == full_key or key.startswith(f"{full_key}."):
            return override.lstrip("+~")
    return f"{full_key}=VALUE"


def _closest(key: str, keys: list[str]) -> str:
    close = difflib.get_close_matches(key, keys, n=3, cutoff=0.6)
    if close:
        return f"closest: {', '.join(close)}"
    shown = [k for k in keys if k != "_target_"]
    more = ", ..." if len(shown) > _LISTED else ""
    return f"its keys: {', '.join(shown[:_LISTED])}{more}"


def _accepts(target: str, key: str) -> bool | None:
    """Whether the class or function `target` names takes an argument `key`; None when
    that cannot be told (it does not import, or has no signature)."""
    module, _, name = target.rpartition(".")
    try:
        found: Any = getattr(importlib.import_module(module), name)
        parameters = inspect.signature(found).parameters.values()
    except Exception:  # anything a user's module raises on import: tell what is known
        return None
    return any(p.name == key or p.kind is p.VAR_KEYWORD for p in parameters)


# The data keys of image sources that conf/task/classification.yaml and the image models
# read; a source without them gives the task (and model) their values itself.
IMAGE_KEYS = ("data.num_classes", "data.channels", "data.image_size")
IMAGE_KEYS_HINTS = {
    "task": "task.num_classes=N and task.input_shape=[...] (one sample's inputs' shape, e.g. [12])",
    "model.num_classes": "model.num_classes=N",
    "model.in_shape": "model.in_shape=[...] (one sample's inputs' shape)",
    "model.in_channels": "model.in_channels=N",
}


def fail_missing_key(group: str, key: str, value: Any, error: Exception) -> None:
    """The line for `group.key` (its unresolved `value`), which reads a key this config
    lacks, named by OmegaConf's `error`."""
    missing = str(error).split("'")[1] if "'" in str(error) else str(error)
    hint = missing_key_hint(group, key, missing)
    fail(f"{group}.{key}", value, f"{missing} does not exist in this config{hint}")


def missing_key_hint(group: str, key: str, missing: str) -> str:
    """What ends the line for `group.key`, which reads the key `missing` that this config
    lacks: where it comes from."""
    if missing in ("data.vocab_size", "data.block_size"):
        return " (token data has it: data=synthetic_tokens or data=tokens)"
    if missing in IMAGE_KEYS:  # the default task's and models' nodes follow images
        name = group if group == "task" else f"{group}.{key}"  # both of the task's
        return f"; a source without images sets {IMAGE_KEYS_HINTS.get(name, f'{name}=...')}"
    return ""
