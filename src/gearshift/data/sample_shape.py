"""The task's `input_shape` against the samples' inputs, before any work: the example
batch built from it (for batch_size=auto and the FLOP count) would otherwise meet the
model first, and a non-image source under the default task ends in a matmul traceback."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import default_collate

from gearshift.config import ConfigError
from gearshift.data.fields import FieldReader, first_sample


def check_input_shape(task_cfg: Any, task: Any, read: FieldReader, dataset: Any) -> None:
    """One line when `task.input_shape` (a key of the task's node) is not the shape of the
    first sample's inputs."""
    wanted = getattr(task, "input_shape", None)
    if "input_shape" not in task_cfg or wanted is None:
        return  # a task of one's own that makes its example batch another way
    sample = first_sample(dataset)
    if sample is None:
        return
    batch = default_collate([sample])
    pair = isinstance(batch, (tuple, list)) and len(batch) == 2
    if not (pair or read.reads_fields):
        return  # a task that reads its batches itself: which field is the input is its own
    inputs, _ = task.split(batch)
    images_or_values = isinstance(inputs, torch.Tensor) and (
        inputs.is_floating_point() or inputs.dtype == torch.uint8
    )
    if not images_or_values:
        return  # token ids, encoded bytes (data.decode=gpu): not the model's input yet
    shape = list(inputs.shape[1:])
    if shape != list(wanted):
        raise ConfigError(
            f"task.input_shape={list(wanted)} is not allowed; the samples' inputs are "
            f"shaped {shape}: set task.input_shape={shape} (the default follows the image "
            "keys data.channels and data.image_size, which a source without images lacks)"
        )
