"""The best validation so far (`checkpoints/best`) and early stopping (`early_stop.*`),
as docs/checkpoints.md describes them; the tracker's state travels in every checkpoint.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from typing import Any

from gearshift.config import ConfigError
from gearshift.config.schema import EarlyStopConfig
from gearshift.tasks import Task
from gearshift.tasks.metrics import task_name

log = logging.getLogger(__name__)


@dataclass
class BestTracker:
    metric: str
    mode: str  # min | max
    min_delta: float = 0.0
    patience: int | None = None  # None: never stop early
    step: int | None = None  # the step of the best validation so far
    value: float | None = None
    bad_validations: int = 0  # validations in a row without an improvement

    def update(self, value: float | None, step: int) -> bool:
        """Count one validation; True when it is the best so far (save it). The one that
        stops the run early says so (rank 0: the other ranks log warnings only)."""
        if self.improves(value):
            self.step, self.value, self.bad_validations = step, value, 0
            return True
        self.bad_validations += 1
        if self.should_stop:
            log.info(
                "early stop at step %d: %s has not improved on %s (step %s) for %d validations",
                step, self.metric, self.value, self.step, self.bad_validations,
            )  # fmt: skip
        return False

    def improves(self, value: float | None) -> bool:
        if value is None or math.isnan(value):
            return False  # a NaN is never better, not even than nothing
        if self.value is None:
            return True
        gain = self.value - value if self.mode == "min" else value - self.value
        return gain > self.min_delta

    @property
    def should_stop(self) -> bool:
        return self.patience is not None and self.bad_validations >= self.patience

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.value = state["step"], state["value"]
        self.bad_validations = state["bad_validations"]

    def summary(self, checkpoint: str | None) -> dict[str, Any]:
        """summary.json's `best`: the metric, its direction, the best step and value."""
        return {
            "metric": self.metric,
            "mode": self.mode,
            "step": self.step,
            "value": self.value,
            "checkpoint": checkpoint if self.step is not None else None,
        }


def build_tracker(task: Task, cfg: EarlyStopConfig) -> BestTracker:
    """The tracker of `task`'s monitor metric with the `early_stop` node's settings."""
    name = task_name(task)
    if task.mode not in ("min", "max"):
        raise ConfigError(f"task {name}: mode={task.mode!r} is not allowed; choose min or max")
    if task.monitor not in task.metrics:
        raise ConfigError(
            f"task {name}: monitor={task.monitor!r} is not allowed; "
            f"choose one of its metrics: {', '.join(task.metrics)}"
        )
    return BestTracker(task.monitor, task.mode, cfg.min_delta, cfg.patience)
