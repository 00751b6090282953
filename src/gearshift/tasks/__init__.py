"""Tasks: what a run learns. The loop asks its task for the loss and the validation
metrics; the batch-size finder and the FLOP counter ask it for an example batch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from gearshift.tasks.base import Batch, Task, build_task
from gearshift.tasks.classification import Classification

if TYPE_CHECKING:
    from gearshift.tasks.lm import LanguageModel
    from gearshift.tasks.regression import Regression

__all__ = ["Batch", "Classification", "LanguageModel", "Regression", "Task", "build_task"]


def __getattr__(name: str) -> object:
    """`gearshift.tasks.LanguageModel` and `.Regression` (their `_target_`s) load their
    modules when first asked for (PEP 562): a run of another task does not import them."""
    module = {"LanguageModel": "lm", "Regression": "regression"}.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
