"""The check of what `Task.loss` returned past a plain scalar tensor: the terms logged beside
the loss (docs/make-it-yours.md, "A term logged beside the loss"), or a form the loop cannot
log, as one line. Loaded by `Task.loss_terms` for a loss with terms or of a wrong form only.
"""

from __future__ import annotations

from typing import Any

import torch

from gearshift.config import ConfigError
from gearshift.tasks.metrics import describe, task_name

# The train/ names the loop logs itself: a term of the loss's may not take one.
TRAINER_NAMES = ("loss", "lr", "grad_norm", "nonfinite_skipped_steps")
EXPECTED = "expected a scalar tensor or (loss, {name: scalar tensor})"


def check_loss(task: Any, loss: Any, terms: Any) -> None:
    """A ConfigError naming the task where its loss returned (loss, terms) the loop cannot log."""
    wrong = _wrong_loss(loss, terms)
    if wrong:
        raise ConfigError(
            f"task._target_={task_name(task)!r} is not allowed; its loss returned {wrong}"
        )


def _wrong_loss(loss: Any, terms: Any) -> str | None:
    """What is wrong with Task.loss's (loss, terms), or None: shapes and types, no device read."""
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        return f"{describe(loss)}, {EXPECTED}"
    if not isinstance(terms, dict):
        return f"(loss, {describe(terms)}), {EXPECTED}"
    for name, term in terms.items():
        if not isinstance(name, str) or not name or name in TRAINER_NAMES:
            taken = ", ".join(TRAINER_NAMES)
            return f"a term named {name!r}; the trainer logs train/ {taken} itself: rename it"
        if not isinstance(term, torch.Tensor) or term.dim() != 0:
            return f"the term {name!r} as {describe(term)}, {EXPECTED}"
    return None
