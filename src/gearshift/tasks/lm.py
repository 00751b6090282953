"""`task=lm`: next-token prediction. The model maps token ids (batch, time) to logits
(batch, time, vocabulary); the loss is the cross-entropy at every position whose target is
not `ignore_index`. Validation reports the mean loss per predicted token and its perplexity."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from gearshift.tasks.base import Batch, Task


class LanguageModel(Task):
    monitor, mode = "val_loss", "min"
    metrics = ("val_loss", "val_perplexity")

    def __init__(self, vocab_size: int, block_size: int, ignore_index: int = -100) -> None:
        self.vocab_size, self.block_size, self.ignore_index = vocab_size, block_size, ignore_index
        self.tokens_per_sample = block_size  # tokens/s in the summary, W&B and the console

    def loss(self, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = model(inputs)
        return F.cross_entropy(
            logits.flatten(0, 1).float(), targets.flatten(), ignore_index=self.ignore_index
        )

    def eval_sums(
        self, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        logits = model(inputs).flatten(0, 1).float()
        targets = targets.flatten()
        loss = F.cross_entropy(logits, targets, ignore_index=self.ignore_index, reduction="sum")
        return {"loss": loss, "tokens": (targets != self.ignore_index).sum()}

    def eval_metrics(self, sums: dict[str, float], count: int) -> dict[str, float]:
        val_loss = sums["loss"] / max(sums["tokens"], 1)  # per predicted token, not per sequence
        return {"val_loss": val_loss, "val_perplexity": math.exp(min(val_loss, 80.0))}

    def example_batch(self, batch_size: int, device: torch.device) -> Batch:
        shape = (batch_size, self.block_size)
        inputs = torch.randint(self.vocab_size, shape, device=device)
        return inputs, torch.randint(self.vocab_size, shape, device=device)
