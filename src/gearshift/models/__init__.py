"""Models: any importable class through `model._target_`, plus small ones of our own."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gearshift.models.gpt import GPT
    from gearshift.models.small import MLP, SimpleCNN

__all__ = ["GPT", "MLP", "SimpleCNN"]


def __getattr__(name: str) -> object:
    """`gearshift.models.GPT`, `MLP` and `SimpleCNN` (model=gpt's, mlp's, simple_cnn's `_target_`)
    load their module when first asked for (PEP 562): a run of another model does not import it."""
    module = {"GPT": "gpt", "MLP": "small", "SimpleCNN": "small"}.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
