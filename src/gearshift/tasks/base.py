"""The Task seam: everything about a run that depends on what is being learnt.

A batch is an `(inputs, targets)` pair, already on the training device: as the data
source's collated samples give it, or read from a dict of named fields (data/fields.py:
`data.fields`, else the task's `input_fields` / `target_fields`, first present wins). The trainer runs `loss` under autocast for every
micro-batch, `eval_sums` under `torch.inference_mode()` for every validation batch, and
reads nothing back from the device between log steps: a task returns tensors, never
Python numbers, from both.

A task of your own subclasses `Task` and is chosen from the command line by its
`_target_` (`task._target_=mypackage.MyTask`), with its constructor's arguments as the
other keys of the `task` node.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from gearshift.config import ConfigError
from gearshift.config.instantiate import instantiate

Batch = tuple[Any, Any]  # (inputs, targets)


class Task(ABC):
    # The validation metric that decides "better" (best checkpoint, a sweeper's objective)
    # and its direction; `metrics` are the keys the summary always holds (null without
    # validation data).
    monitor: str = "val_loss"
    mode: str = "min"  # min | max
    metrics: tuple[str, ...] = ("val_loss",)
    # Tokens a sample holds (a language model: its block size), for tokens/s beside
    # samples/s; None where a sample is not made of tokens.
    tokens_per_sample: int | None = None
    # The field names a dict sample (a Hugging Face dataset's, your own) is read by, in
    # order of preference; `data.fields.inputs` / `data.fields.targets` override them.
    input_fields: tuple[str, ...] = ("inputs", "pixel_values", "image", "img", "x")
    target_fields: tuple[str, ...] = ("targets", "label", "labels", "fine_label", "y")
    targets_optional: bool = False  # True: a sample without a target field is readable

    def from_fields(self, inputs: Any, targets: Any | None) -> Batch:
        """(inputs, targets) from a dict batch's fields (targets None: the sample has none,
        allowed where `targets_optional`)."""
        return inputs, targets

    @abstractmethod
    def loss(self, model: nn.Module, inputs: Any, targets: Any) -> torch.Tensor:
        """The batch's mean loss, a scalar tensor with a graph back to the parameters."""

    def count(self, inputs: Any, targets: Any) -> int:
        """How many samples the batch covers (from shapes: no device read)."""
        return len(targets)

    @abstractmethod
    def eval_sums(self, model: nn.Module, inputs: Any, targets: Any) -> dict[str, torch.Tensor]:
        """Per-batch sums (scalar tensors on the device) that `eval_metrics` turns into
        metrics once summed over every batch and rank."""

    @abstractmethod
    def eval_metrics(self, sums: dict[str, float], count: int) -> dict[str, float]:
        """The validation metrics (keys `metrics`) from the sums over `count` samples."""

    @abstractmethod
    def example_batch(self, batch_size: int, device: torch.device) -> Batch:
        """A batch shaped like the training data, for the batch-size finder and the FLOP
        counter (random values are fine: they measure memory and arithmetic, not learning)."""


def build_task(node: DictConfig) -> Task:
    """The task the `task` node names, or a one-line ConfigError."""
    options = OmegaConf.to_container(node, resolve=True)
    task = instantiate("task", options)
    if not isinstance(task, Task):
        raise ConfigError(
            f"task._target_={options['_target_']!r} is not allowed; it built a "
            f"{type(task).__name__}, expected a subclass of gearshift.tasks.Task"
        )
    return task
