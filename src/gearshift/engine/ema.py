"""Weight averaging (`ema.decay`): an exponential moving average of the model's weights.

After every optimizer step, on the device and without reading anything back:

    ema = decay * ema + (1 - decay) * weight      (torch._foreach_lerp_, one call per step)

for every parameter, while buffers (BatchNorm's running statistics and counters) are
copied as they are. The average lives in a copy of the model (`EMA.model`), so it is
validated and saved like the model itself: its state dict has the model's keys.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import torch
from torch import nn

from gearshift.config.schema import EmaConfig

log = logging.getLogger(__name__)


class EMA:
    """The average of `model`'s weights; `update(step)` after each optimizer step."""

    sharded = True  # checkpoints save it as the model, tensors by name (state/checkpointer.py)

    def __init__(self, model: nn.Module, decay: float, every_n_steps: int, start_step: int) -> None:
        self.decay, self.every_n_steps, self.start_step = decay, every_n_steps, start_step
        self.model = copy.deepcopy(model).eval()  # starts from the weights as they are now
        self.model.requires_grad_(False)
        self.averaged = list(self.model.parameters())
        self.live = list(model.parameters())
        self.averaged_buffers = list(self.model.buffers())
        self.live_buffers = list(model.buffers())

    @torch.no_grad()
    def update(self, step: int) -> None:
        """Fold the weights after optimizer step `step` into the average. Before
        `start_step` the average follows the weights; from it on, every `every_n_steps`."""
        if step < self.start_step:
            torch._foreach_copy_(self.averaged, self.live)
        elif (step - self.start_step) % self.every_n_steps == 0:
            torch._foreach_lerp_(self.averaged, self.live, 1.0 - self.decay)
        else:
            return
        if self.averaged_buffers:
            torch._foreach_copy_(self.averaged_buffers, self.live_buffers)

    def state_dict(self) -> dict[str, Any]:
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state)


def build_ema(cfg: EmaConfig, model: nn.Module) -> EMA | None:
    """The average `cfg` (the `ema` node) asks for, or None with `ema.decay=null`."""
    if cfg.decay is None:
        return None
    return EMA(model, cfg.decay, cfg.every_n_steps, cfg.start_step)
