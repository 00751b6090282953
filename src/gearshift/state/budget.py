"""A run's length where `max_steps` and its epochs do not say it alone: the steps of a
`max_tokens` budget, and a resumed run whose optimizer step takes another number of
samples than its checkpoint's run took (other ranks, batch_size or accum), whose budget
and schedule are recounted from the samples trained. Loaded by build.py's build_run when
`max_tokens` is set or the run resumes."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gearshift.config import ConfigError

if TYPE_CHECKING:
    from gearshift.state.checkpointer import Saved
    from gearshift.tasks import Task

log = logging.getLogger(__name__)


@dataclass
class Trained:
    """What a resumed run's checkpoint had trained: its steps, and its samples over all
    ranks (nominal: batch_size x ranks a micro-batch) at `per_step` samples a step."""

    step: int
    samples: int
    per_step: int

    @classmethod
    def of(cls, saved: Saved | None) -> Trained | None:
        if saved is None:
            return None
        position, accum = saved.state["position"], saved.config.get("accum", 1)
        per_step = position.get("global_batch", 0) * accum
        samples = position.get("trained", position["step"] * per_step)  # older: one layout
        return cls(position["step"], samples, per_step)


def resized(trained: Trained | None, per_step: int) -> bool:
    """A resume whose optimizer step takes another number of samples than the saved run's
    (other ranks, batch_size or accum): its steps no longer count the same work."""
    return trained is not None and trained.per_step not in (0, per_step)


def run_length(
    max_steps: int | None, max_tokens: int | None, epochs_steps: int, task: Task,
    per_step: int, trained: Trained | None, speak: bool,
) -> tuple[int | None, int]:  # fmt: skip
    """The step budget (None: the epochs decide) and the run's last step, the schedules'
    length: the budget's, else its epochs' (`epochs_steps` for a fresh run). A resume at
    another samples per step says how it recounted them (`speak`: this rank logs)."""
    budget = step_budget(max_steps, max_tokens, task, per_step, trained)
    total_steps = budget or epoch_steps(epochs_steps, per_step, trained)
    if resized(trained, per_step) and speak:
        log.info(
            "resumed at %d samples a step (the checkpoint's run took %d): the schedule and "
            "any token budget are recounted from the %d samples trained; it ends at step %d",
            per_step, trained.per_step, trained.samples,
            total_steps,
        )  # fmt: skip
    return budget, total_steps


def step_budget(
    max_steps: int | None, max_tokens: int | None, task: Task, per_step: int,
    trained: Trained | None = None,
) -> int | None:  # fmt: skip
    """The run's last optimizer step when a budget sets it, else None (epochs decide):
    `max_steps`, or `max_tokens` over the tokens of one optimizer step (`per_step` samples:
    batch size x ranks x accum; times the task's tokens per sample), rounded up; with both,
    whichever ends first.
    A resume at another samples per step counts the tokens left from those trained."""
    budgets = [max_steps] if max_steps else []
    if max_tokens is not None:
        if task.tokens_per_sample is None:
            raise ConfigError(
                f"max_tokens={max_tokens} is not allowed; {type(task).__name__}'s samples "
                "are not tokens (task=lm's are): use max_steps or epochs"
            )
        tokens = per_step * task.tokens_per_sample  # a step's
        if resized(trained, per_step):  # the tokens left, from the step the run resumes at
            left = max_tokens - trained.samples * task.tokens_per_sample
            budgets.append(trained.step + max(0, math.ceil(left / tokens)))
        else:
            budgets.append(math.ceil(max_tokens / tokens))
    return min(budgets) if budgets else None


def epoch_steps(steps: int, per_step: int, trained: Trained | None = None) -> int:
    """The optimizer steps of the run's epochs (`steps` for a fresh run: the schedule's
    length when epochs decide) at `per_step` samples a step. A resume at another samples
    per step: the steps taken, then those of the samples left."""
    if not resized(trained, per_step):
        return steps
    return trained.step + max(0, math.ceil((steps * per_step - trained.samples) / per_step))
