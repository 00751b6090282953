"""Validation metrics (`torchmetrics.Metric` accumulators: docs/make-it-yours.md, "The task")
and their check on the example batch before the run. `Mean` is the built-in tasks' small one
(two sums on the device); classification's two are here, the others' beside their tasks.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import Metric

from gearshift.config import ConfigError


class Mean(Metric):
    """The mean of `values(predictions, targets)` over every element of every batch and
    rank, weighted by `weights(...)` (default: 1 each)."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("total", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("weight", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def values(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def weights(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | int:
        return targets.numel()

    def update(self, predictions: torch.Tensor, targets: torch.Tensor) -> None:
        self.total += self.values(predictions, targets).double().sum()
        self.weight += self.weights(predictions, targets)

    def compute(self) -> torch.Tensor:
        return self.total / self.weight.clamp(min=1)


class CrossEntropy(Mean):
    """The mean cross-entropy of logits (batch, classes) against class indices."""

    def values(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(predictions.float(), targets, reduction="none")


class Accuracy(Mean):
    """The share of samples whose highest logit is their class."""

    def values(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return predictions.argmax(dim=1) == targets


class ValidationFailed(Exception):
    """A task's or a metric's code raised while validating: `what` names it (the line the
    run ends with), `error` is what it raised."""

    def __init__(self, what: str, error: BaseException) -> None:
        said = " ".join(str(error).split())  # one line, whatever the message's own layout
        super().__init__(f"{what} raised {type(error).__name__}: {said}")


@contextmanager
def failing_as(what: str) -> Iterator[None]:
    """Run a task's or a metric's code at validation: what it raises becomes
    ValidationFailed naming `what` (an out-of-memory error keeps its own line)."""
    try:
        yield
    except (torch.OutOfMemoryError, ValidationFailed):
        raise
    except Exception as error:
        raise ValidationFailed(what, error) from error


def check_metrics(
    task: Any, model: nn.Module, batch: Any, autocast: Any, configured: Mapping[str, str]
) -> None:
    """Validate `batch` (the task's example batch, on the device) with copies of the task's
    metrics, unsynced: a metric that raises, or computes anything but one number, is one
    line before the run starts, not a traceback after it trained. `configured`: the
    `task.metrics` node's metrics, by name, with their `_target_`."""
    training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            with autocast():
                try:
                    predictions, targets = task.eval_step(model, batch)
                except Exception as error:
                    raise ConfigError(
                        f"task._target_={task_name(task)!r} is not allowed; its eval_step raised "
                        f"{type(error).__name__}: {error} on the example batch"
                    ) from None
            copies = copy.deepcopy(dict(task.validation))
            for name, metric in copies.items():
                metric._to_sync = False  # each rank checks its own copy
                what = f"task._target_={task_name(task)!r} (its metric {name!r})"
                if name in configured:
                    what = f"task.metrics.{name}._target_={configured[name]!r}"
                try:
                    metric.update(predictions, targets)
                    value = metric.compute()
                except Exception as error:
                    raise ConfigError(
                        f"{what} is not allowed; on the example batch it raised "
                        f"{type(error).__name__}: {error}"
                    ) from None
                if not is_scalar(value):
                    raise ConfigError(
                        f"{what} is not allowed; it computes {describe(value)}, expected one "
                        "number (a per-class metric: average it, e.g. average=macro)"
                    )
    finally:
        model.train(training)


def is_scalar(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    return f"a {type(value).__name__}"


def task_name(task: Any) -> str:
    return f"{type(task).__module__}.{type(task).__qualname__}"
