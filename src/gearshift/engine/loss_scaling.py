"""amp=fp16's GradScaler at work: the gradients unscaled, the optimizers stepped through it
(skipped together where the gradients hold inf/nan) and the skipped steps counted on the
device. Loaded only where the autocast dtype is float16 (engine/precision.py Precision);
bf16 has float32's range and needs no scaling.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from gearshift.engine.optim import Optimizers


def scaled(optimizers: Optimizers) -> torch.optim.Optimizer | Optimizers:
    """What the GradScaler unscales and steps: one optimizer itself (a fused one takes the
    scale and skips on the device, with no host read), several as one (GradScaler reads
    `param_groups` and calls `step()`): one inf/nan read a step, not one per optimizer, and
    they skip together."""
    return optimizers.optimizers[0] if len(optimizers.optimizers) == 1 else optimizers


def unscale(scaler: torch.amp.GradScaler, optimizers: Optimizers) -> None:
    scaler.unscale_(scaled(optimizers))


def scaled_step(scaler: torch.amp.GradScaler, optimizers: Optimizers) -> torch.Tensor:
    """One update of every optimizer through the GradScaler, which skips it when the
    gradients hold inf/nan, then the scale's update: 1 where the step was skipped, else 0
    (a tensor on the device)."""
    scaler.step(scaled(optimizers))  # several: calls Optimizers.step()
    # The scale only shrinks after a skipped step; compare on the device, never on the host.
    scale_before = scaler._scale.clone()
    scaler.update()  # once for all the optimizers: their inf/nan checks combined
    return (scaler._scale < scale_before).long()
