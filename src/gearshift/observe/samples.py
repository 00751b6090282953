"""Text samples at validations (`task.sample_every=N`, task=lm): a few short continuations
drawn from the GPT and logged, so a run shows what its model writes as it learns.

They are drawn at validation time only (the loop's steps never wait for them), with the
KV cache of models/sampling.py and the vocabulary `python -m gearshift.generate` decodes
with (data/text.py `codec_for`). Rank 0 logs them: a W&B table, TensorBoard text and
metrics.csv rows (observe/loggers.py `log_text`). Under FSDP every rank takes part in the
forward passes (each holds a shard of the weights) with the same seeded draws, so all
ranks draw the same tokens; otherwise rank 0 alone samples.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from torch import nn

from gearshift.config import ConfigError
from gearshift.data.text import codec_for
from gearshift.engine.precision import Precision
from gearshift.models.gpt import GPT
from gearshift.models.sampling import generate
from gearshift.tasks.lm import SampleSettings


class Sampler:
    """Decides at which validations samples are drawn, draws and decodes them."""

    def __init__(
        self,
        settings: SampleSettings,
        data: DictConfig,
        model: nn.Module,
        val_every: int | None,
        seed: int,
    ) -> None:
        if not isinstance(model, GPT):
            raise ConfigError(
                f"task.sample_every={settings.every} is not allowed; samples are drawn with "
                f"the GPT's KV cache (model=gpt), and this model is a {type(model).__name__}"
            )
        self.settings, self.val_every, self.seed = settings, val_every, seed
        self.codec = codec_for(data)
        if settings.prompt is None:
            self.prompt = torch.zeros(1, dtype=torch.long)  # the vocabulary's first token
        else:
            try:
                ids = self.codec.encode(settings.prompt)
            except ValueError as error:
                raise ConfigError(
                    f"task.sample_prompt={settings.prompt!r} is not allowed; {error}"
                ) from None
            if len(ids) == 0:
                raise ConfigError(
                    f"task.sample_prompt={settings.prompt!r} is not allowed; it encodes to no token"
                )
            self.prompt = torch.as_tensor(ids, dtype=torch.long)

    def due(self, step: int, last: bool) -> bool:
        """Whether the validation at `step` draws samples: every N-th scheduled one (steps
        k x val_every_n_steps, k a multiple of N: the same steps after a resume) and the
        run's last."""
        if last:
            return True
        if self.val_every is None or step % self.val_every:
            return False
        return (step // self.val_every) % self.settings.every == 0

    def draw(self, model: GPT, precision: Precision, step: int) -> list[str]:
        """`count` decoded continuations of the prompt (the prompt included), seeded by the
        run's seed and the step: reproducible, and different at each validation."""
        s = self.settings
        device = model.wte.weight.device
        idx = self.prompt.to(device).repeat(s.count, 1)
        generator = torch.Generator(device=device).manual_seed(self.seed * 1_000_003 + step)
        training = model.training
        model.eval()
        try:
            with precision.autocast():
                out = generate(model, idx, s.tokens, s.temperature, generator=generator)
        finally:
            model.train(training)
        return [self.codec.decode(row) for row in out.cpu().numpy()]


def build_sampler(
    settings: SampleSettings | None,
    data: DictConfig,
    model: nn.Module,
    val_every: int | None,
    seed: int,
) -> Sampler | None:
    """The run's sampler, or None when the task draws no samples. `data`: the data node,
    whose vocabulary decodes the samples."""
    if settings is None:
        return None
    return Sampler(settings, data, model, val_every, seed)
