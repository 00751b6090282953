"""`task=lm`: next-token prediction. The model maps token ids (batch, time) to logits
(batch, time, vocabulary); the loss is the cross-entropy at every position whose target is
not `ignore_index`. Validation reports the mean loss per predicted token and its perplexity
and, given the text's UTF-8 bytes per token, its bits per byte (`val_bpb`): a figure that,
unlike the loss per token, does not depend on the tokenizer (nanochat reports it)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import Metric

from gearshift.config import ConfigError
from gearshift.tasks.base import Batch, Task
from gearshift.tasks.metrics import Mean


@dataclass(frozen=True)
class SampleSettings:
    """`task.sample_every=N` and its companions: `count` continuations of `prompt` (null:
    the vocabulary's first token), `tokens` long, drawn at every N-th validation."""

    every: int
    prompt: str | None = None
    tokens: int = 64
    count: int = 2
    temperature: float = 1.0

    def __post_init__(self) -> None:
        for key, value, minimum in (
            ("sample_every", self.every, 1), ("sample_tokens", self.tokens, 1),
            ("sample_count", self.count, 1),
        ):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ConfigError(
                    f"task.{key}={value!r} is not allowed; expected an integer >= {minimum}"
                )
        temperature = self.temperature
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:  # fmt: skip
            raise ConfigError(
                f"task.sample_temperature={temperature!r} is not allowed; expected a number >= 0 "
                "(0: greedy)"
            )


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


class LanguageModel(Task):
    monitor, mode = "val_loss", "min"
    # Hugging Face's causal-LM fields: `input_ids` and, optionally, `labels` (the same
    # positions, -100 where no loss is taken); both are shifted here to next-token pairs.
    input_fields, target_fields, targets_optional = ("input_ids",), ("labels",), True

    def __init__(
        self,
        vocab_size: int,
        block_size: int,
        ignore_index: int = -100,
        bytes_per_token: float | None = None,
        sample_every: int | None = None,
        sample_prompt: str | None = None,
        sample_tokens: int = 64,
        sample_count: int = 2,
        sample_temperature: float = 1.0,
    ) -> None:
        self.vocab_size, self.block_size, self.ignore_index = vocab_size, block_size, ignore_index
        self.tokens_per_sample = block_size  # tokens/s in the summary, W&B and the console
        number = isinstance(bytes_per_token, (int, float)) and not isinstance(bytes_per_token, bool)
        if bytes_per_token is not None and not (number and bytes_per_token > 0):
            raise ConfigError(
                f"task.bytes_per_token={bytes_per_token!r} is not allowed; expected a number > 0 "
                "(or null: no val_bpb)"
            )
        self.bytes_per_token = bytes_per_token  # None: no val_bpb
        # text samples at validations (observe/samples.py draws them; None: off)
        self.sampling = None
        if sample_every is not None:
            self.sampling = SampleSettings(
                sample_every, sample_prompt, sample_tokens, sample_count, sample_temperature
            )

    def from_fields(
        self, inputs: torch.Tensor, targets: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Windows of block_size + 1 tokens: each position predicts the next one."""
        targets = inputs if targets is None else targets
        return inputs[:, :-1], targets[:, 1:]

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        inputs, targets = self.split(batch)
        logits = model(inputs)
        return F.cross_entropy(
            logits.flatten(0, 1).float(), targets.flatten(), ignore_index=self.ignore_index
        )

    def val_metrics(self) -> dict[str, Metric]:
        loss = TokenCrossEntropy(self.ignore_index)  # per predicted token, not per sequence
        metrics = {"loss": loss, "perplexity": Derived(loss, perplexity)}
        if self.bytes_per_token is not None:  # nats per token -> bits per token -> per byte
            bytes_per_token = self.bytes_per_token
            metrics["bpb"] = Derived(loss, lambda nats: nats / math.log(2) / bytes_per_token)
        return metrics

    def example_batch(self, batch_size: int, device: torch.device) -> Batch:
        shape = (batch_size, self.block_size)
        inputs = torch.randint(self.vocab_size, shape, device=device)
        return inputs, torch.randint(self.vocab_size, shape, device=device)
