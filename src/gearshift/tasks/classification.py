"""`task=classification` (the default): cross-entropy on class indices, accuracy."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import Metric

from gearshift.tasks.base import IMAGE_FIELDS, LABEL_FIELDS, Batch, Task
from gearshift.tasks.metrics import Accuracy, CrossEntropy


class Classification(Task):
    monitor, mode = "val_accuracy", "max"
    input_fields, target_fields = IMAGE_FIELDS, LABEL_FIELDS

    def __init__(self, num_classes: int, input_shape: Sequence[int]) -> None:
        self.num_classes, self.input_shape = num_classes, tuple(input_shape)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        inputs, targets = self.split(batch)
        return F.cross_entropy(model(inputs), targets)

    def val_metrics(self) -> dict[str, Metric]:
        return {"loss": CrossEntropy(), "accuracy": Accuracy()}

    def example_batch(self, batch_size: int, device: torch.device) -> Batch:
        inputs = torch.randn(batch_size, *self.input_shape, device=device)
        return inputs, torch.randint(self.num_classes, (batch_size,), device=device)
