"""`task=classification` (the default): cross-entropy on class indices, accuracy."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from gearshift.tasks.base import IMAGE_FIELDS, LABEL_FIELDS, Batch, Task


class Classification(Task):
    monitor, mode = "val_accuracy", "max"
    metrics = ("val_loss", "val_accuracy")
    input_fields, target_fields = IMAGE_FIELDS, LABEL_FIELDS

    def __init__(self, num_classes: int, input_shape: Sequence[int]) -> None:
        self.num_classes, self.input_shape = num_classes, tuple(input_shape)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        inputs, targets = self.split(batch)
        return F.cross_entropy(model(inputs), targets)

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        inputs, targets = self.split(batch)
        logits = model(inputs)
        return {
            "loss": F.cross_entropy(logits.float(), targets, reduction="sum"),
            "correct": (logits.argmax(dim=1) == targets).sum(),
        }

    def eval_metrics(self, sums: dict[str, float], count: int) -> dict[str, float]:
        return {"val_loss": sums["loss"] / count, "val_accuracy": sums["correct"] / count}

    def example_batch(self, batch_size: int, device: torch.device) -> Batch:
        inputs = torch.randn(batch_size, *self.input_shape, device=device)
        return inputs, torch.randint(self.num_classes, (batch_size,), device=device)
