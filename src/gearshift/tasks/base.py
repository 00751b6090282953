"""The Task seam: everything about a run that depends on what is being learnt. What the
loop and validation ask of a task, and when (each batch whole, on the device; tensors back,
never Python numbers): docs/architecture.md, "Your own task", and docs/make-it-yours.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from functools import cached_property
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils._pytree import tree_leaves
from torchmetrics import Metric

from gearshift.config import ConfigError
from gearshift.config.instantiate import instantiate
from gearshift.config.targets import TRAINER_KEYS
from gearshift.tasks.metrics import task_name

Batch = Any  # as the loader yields it: a pair, a dict of fields, any nesting of them
Loss = torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]  # Task.loss's two forms
# The fields an image task reads a dict sample by (a Hugging Face dataset's, your own).
IMAGE_FIELDS = ("inputs", "pixel_values", "image", "img", "x")
LABEL_FIELDS = ("targets", "label", "labels", "fine_label", "y")


class Task(ABC):
    # The validation metric that decides "better", and its direction (task.monitor, task.mode).
    monitor: str = "val_loss"
    mode: str = "min"  # min | max
    # Tokens a sample holds (task=lm: its block size), for tokens/s; None: not made of tokens.
    tokens_per_sample: int | None = None
    # The field names `split` reads a dict batch by, in order of preference
    # (`data.fields.inputs` / `data.fields.targets` override them); none: the task reads
    # its batches itself, and the samples' fields are not checked before the run.
    input_fields: tuple[str, ...] = ()
    target_fields: tuple[str, ...] = ()
    targets_optional: bool = False  # True: a sample without a target field is readable

    def split(self, batch: Batch) -> tuple[Any, Any]:
        """(inputs, targets) of a batch: a pair as it is, a dict by the task's field names
        (first present wins), as `from_fields` makes them."""
        if not isinstance(batch, Mapping):
            inputs, targets = batch
            return inputs, targets
        inputs = next((name for name in self.input_fields if name in batch), None)
        targets = next((name for name in self.target_fields if name in batch), None)
        if inputs is None or (targets is None and not self.targets_optional):
            from gearshift.tasks.unreadable import unreadable  # a batch it cannot read

            raise ConfigError(unreadable(self, batch))
        return self.from_fields(batch[inputs], None if targets is None else batch[targets])

    def wanted(self) -> str:
        """The fields `split` reads, for the line of a batch without them."""
        wanted = f"inputs from one of: {', '.join(self.input_fields)}"
        if not self.targets_optional:
            wanted += f"; targets from one of: {', '.join(self.target_fields)}"
        return wanted

    def from_fields(self, inputs: Any, targets: Any | None) -> tuple[Any, Any]:
        """(inputs, targets) from a dict batch's fields (targets None: the sample has none,
        allowed where `targets_optional`)."""
        return inputs, targets

    @abstractmethod
    def loss(self, model: nn.Module, batch: Batch) -> Loss:
        """The batch's mean loss, a scalar tensor with a graph back to the parameters; or
        `(loss, {name: scalar tensor})`, the terms logged beside it as train/<name>."""

    def loss_terms(
        self, model: nn.Module, batch: Batch
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """`loss` as (the loss, its logged terms, maybe none), checked on the host only:
        a form the loop cannot log is one line."""
        value = self.loss(model, batch)
        loss, terms = value if isinstance(value, tuple) and len(value) == 2 else (value, {})
        no_terms = isinstance(terms, dict) and not terms
        if not (no_terms and isinstance(loss, torch.Tensor) and loss.dim() == 0):
            from gearshift.tasks.loss_terms import check_loss  # terms, or a wrong form

            check_loss(self, loss, terms)
        return loss, terms

    def count(self, batch: Batch) -> int:
        """How many samples the batch covers: the leading size of its first tensor (from
        shapes: no device read)."""
        first = next((leaf for leaf in tree_leaves(batch) if isinstance(leaf, torch.Tensor)), None)
        if first is None or first.dim() == 0:
            raise ConfigError(
                f"task._target_={task_name(self)!r} is not allowed; a batch holds no tensor with "
                "a batch dimension to count its samples by: override Task.count(batch)"
            )
        return first.shape[0]

    def eval_step(self, model: nn.Module, batch: Batch) -> tuple[Any, Any]:
        """A validation batch's (predictions, targets), tensors left on the device, which each
        metric is updated with; default: the model's outputs for the inputs `split` reads."""
        inputs, targets = self.split(batch)
        return model(inputs), targets

    @abstractmethod
    def val_metrics(self) -> dict[str, Metric]:
        """The task's own validation metrics by name, logged as val/<name>: torchmetrics.Metric
        objects (tasks/metrics.py has small ones), each updated with every `eval_step`'s."""

    @cached_property  # made once: the metrics accumulate, and build_task adds to them
    def validation(self) -> dict[str, Metric]:
        """Every metric a validation updates: the task's own, then those `task.metrics` adds."""
        return dict(self.val_metrics())

    @property
    def metrics(self) -> tuple[str, ...]:
        """The summary's keys of the validation metrics (null without validation data)."""
        return tuple(f"val_{name}" for name in self.validation)

    @abstractmethod
    def example_batch(self, batch_size: int, device: torch.device) -> Batch:
        """A batch in the loader's form shaped like the training data, for the batch-size finder,
        the planner and the FLOP count (random values do: they measure memory and arithmetic)."""


def build_task(node: DictConfig) -> Task:
    """The task the `task` node names, with the metrics `task.metrics` adds and the
    `task.monitor` / `task.mode` it is judged by, or a one-line ConfigError."""
    options = OmegaConf.to_container(node, resolve=True)
    added, monitor, mode = (options.pop(key, None) for key in TRAINER_KEYS["task"])
    task = instantiate("task", options)
    if not isinstance(task, Task):
        raise ConfigError(
            f"task._target_={options['_target_']!r} is not allowed; it built a "
            f"{type(task).__name__}, expected a subclass of gearshift.tasks.Task"
        )
    task.monitor, task.mode = monitor or task.monitor, mode or task.mode
    if added is not None:
        from gearshift.tasks.added_metrics import build_metrics  # task.metrics only

        task.validation.update(build_metrics(added, task.validation))
    return task
