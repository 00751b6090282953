"""`task=regression`: mean squared error on real-valued targets, with mean absolute error."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import Metric

from gearshift.tasks.base import IMAGE_FIELDS, LABEL_FIELDS, Batch, Task
from gearshift.tasks.metrics import Mean


class MeanSquaredError(Mean):
    def values(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (predictions.float() - targets).square()


class MeanAbsoluteError(Mean):
    def values(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (predictions.float() - targets).abs()


class Regression(Task):
    monitor, mode = "val_loss", "min"
    input_fields, target_fields = IMAGE_FIELDS, LABEL_FIELDS

    def __init__(self, num_outputs: int, input_shape: Sequence[int]) -> None:
        self.num_outputs, self.input_shape = num_outputs, tuple(input_shape)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        inputs, targets = self.split(batch)
        return F.mse_loss(model(inputs).float(), targets)

    def eval_step(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = self.split(batch)
        return model(inputs).float(), targets

    def val_metrics(self) -> dict[str, Metric]:
        # means over every output of every sample: per-sample means of the outputs' errors
        return {"loss": MeanSquaredError(), "mae": MeanAbsoluteError()}

    def example_batch(self, batch_size: int, device: torch.device) -> Batch:
        inputs = torch.randn(batch_size, *self.input_shape, device=device)
        return inputs, torch.randn(batch_size, self.num_outputs, device=device)
