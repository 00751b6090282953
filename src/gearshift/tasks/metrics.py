"""Validation metrics as accumulators: `torchmetrics.Metric`s, updated with each validation
batch's (predictions, targets) on the device, synced across ranks once, when computed.

A task's own metrics (`Task.val_metrics`) and those the command line adds
(`task.metrics.<name>._target_`, any torchmetrics class) are alike: `update(predictions,
targets)` per batch, `compute()` at the end of a validation, `reset()` before the next. The
small ones here are the built-in tasks': means of a per-element quantity, kept as two sums
on the device (no host read while validating), and the values derived from another
metric (a perplexity from its loss).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torchmetrics import Metric

from gearshift.config import ConfigError
from gearshift.config.instantiate import instantiate


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


class MeanSquaredError(Mean):
    def values(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (predictions.float() - targets).square()


class MeanAbsoluteError(Mean):
    def values(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (predictions.float() - targets).abs()


class TokenCrossEntropy(Mean):
    """The mean cross-entropy per predicted token of logits (batch, time, vocabulary):
    positions whose target is `ignore_index` count for nothing."""

    def __init__(self, ignore_index: int = -100) -> None:
        super().__init__()
        self.ignore_index = ignore_index

    def values(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = predictions.flatten(0, 1).float()
        return F.cross_entropy(
            logits, targets.flatten(), ignore_index=self.ignore_index, reduction="none"
        )

    def weights(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (targets != self.ignore_index).sum()


class Derived(Metric):
    """A value computed from another metric of the same task (a perplexity from the loss):
    that one accumulates and syncs; this one only reads its result."""

    full_state_update = False

    def __init__(self, source: Metric, value: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.source, self.value = source, value

    def update(self, predictions: Any, targets: Any) -> None:
        pass  # the source is updated in its own right

    def compute(self) -> torch.Tensor:
        return self.value(self.source.compute())  # on the device: no host read


def perplexity(loss: torch.Tensor) -> torch.Tensor:
    return loss.clamp(max=80.0).exp()  # capped: a diverged model's is not worth an overflow


class ValidationFailed(Exception):
    """A task's or a metric's code raised while validating: `what` names it (the line the
    run ends with), `error` is what it raised."""

    def __init__(self, what: str, error: BaseException) -> None:
        said = " ".join(str(error).split())  # one line, whatever the message's own layout
        super().__init__(f"{what} raised {type(error).__name__}: {said}")
        self.what, self.error = what, error


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


def build_metrics(node: Any, own: Mapping[str, Metric]) -> dict[str, Metric]:
    """The metrics the `task.metrics` node adds (`<name>: {_target_: ..., args}`), each a
    torchmetrics.Metric under a name the task does not use itself, or a one-line ConfigError."""
    if node is None:
        return {}
    options = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
    if not isinstance(options, dict):
        raise ConfigError(
            f"task.metrics={options!r} is not allowed; expected metrics by name, "
            "task.metrics.<name>._target_=<a torchmetrics.Metric class>"
        )
    metrics = {}
    for name, spec in options.items():
        key = f"task.metrics.{name}"
        if name in own:
            raise ConfigError(
                f"{key} is not allowed; the task computes val_{name} itself: choose another name"
            )
        if not isinstance(spec, dict) or not spec.get("_target_"):
            raise ConfigError(
                f"{key}={spec!r} is not allowed; expected {key}._target_=<a torchmetrics.Metric "
                "class> and its arguments as the other keys"
            )
        metric = instantiate(key, spec)
        if not isinstance(metric, Metric):
            raise ConfigError(
                f"{key}._target_={spec['_target_']!r} is not allowed; it built a "
                f"{type(metric).__name__}, expected a torchmetrics.Metric"
            )
        metrics[name] = metric
    return metrics


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
                what = _what(task, name, configured)
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


def stop_checking_arguments(metrics: Mapping[str, Metric], node: Mapping[str, Any]) -> None:
    """`validate_args` off for the metrics the `task.metrics` node built that have it
    (torchmetrics' classification ones) and whose node does not set it: their check of each
    update's targets (torch.unique) is a host-device sync per validation batch. Call it
    after check_metrics: the example batch was checked with it on, and so were the
    arguments, when the metric was built. A task's own metrics stay as it made them."""
    for name, options in node.items():
        has_switch = isinstance(getattr(metrics[name], "validate_args", None), bool)
        if has_switch and "validate_args" not in options:
            metrics[name].validate_args = False


def is_scalar(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    return f"a {type(value).__name__}"


def _what(task: Any, name: str, configured: Mapping[str, str]) -> str:
    if name in configured:
        return f"task.metrics.{name}._target_={configured[name]!r}"
    return f"task._target_={task_name(task)!r} (its metric {name!r})"


def task_name(task: Any) -> str:
    return f"{type(task).__module__}.{type(task).__qualname__}"
