"""The metrics the `task.metrics` node adds (`task.metrics.<name>._target_`, any
torchmetrics class): built under names the task does not use itself, and, once the example
batch has checked them, their own checks of each batch switched off.

Loaded only where `task.metrics` is set (tasks/base.py build_task, build.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from torchmetrics import Metric

from gearshift.config import ConfigError
from gearshift.config.instantiate import instantiate


def build_metrics(node: Any, own: Mapping[str, Metric]) -> dict[str, Metric]:
    """The metrics the `task.metrics` node adds (`<name>: {_target_: ..., args}`), each a
    torchmetrics.Metric under a name the task does not use itself, or a one-line ConfigError."""
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
