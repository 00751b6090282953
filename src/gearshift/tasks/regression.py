"""`task=regression`: mean squared error on real-valued targets, with mean absolute error."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from gearshift.tasks.base import IMAGE_FIELDS, LABEL_FIELDS, Batch, Task


class Regression(Task):
    monitor, mode = "val_loss", "min"
    metrics = ("val_loss", "val_mae")
    input_fields, target_fields = IMAGE_FIELDS, LABEL_FIELDS

    def __init__(self, num_outputs: int, input_shape: Sequence[int]) -> None:
        self.num_outputs, self.input_shape = num_outputs, tuple(input_shape)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        inputs, targets = self.split(batch)
        return F.mse_loss(model(inputs).float(), targets)

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        inputs, targets = self.split(batch)
        error = model(inputs).float() - targets
        # per sample: summed over outputs, so the metrics are per-sample means
        return {
            "squared": error.square().sum() / self.num_outputs,
            "absolute": error.abs().sum() / self.num_outputs,
        }

    def eval_metrics(self, sums: dict[str, float], count: int) -> dict[str, float]:
        return {"val_loss": sums["squared"] / count, "val_mae": sums["absolute"] / count}

    def example_batch(self, batch_size: int, device: torch.device) -> Batch:
        inputs = torch.randn(batch_size, *self.input_shape, device=device)
        return inputs, torch.randn(batch_size, self.num_outputs, device=device)
