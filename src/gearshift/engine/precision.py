"""Mixed precision (docs/gears.md tip 11): autocast for the forward pass, a GradScaler only for
float16. The dtype comes with the reason it was chosen, for the log and summary.json: amp=off's
here, the others' (`amp=on` resolved against the machine) in amp_choice.py, loaded then only.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from gearshift.engine.optim import Optimizers


@dataclass(frozen=True)
class AmpChoice:
    dtype: torch.dtype | None  # None: float32, no autocast
    reason: str  # why, in words, for the log and summary.json


def amp_name(dtype: torch.dtype | None) -> str:
    """The resolved amp switch as summary.json's gears name it: "bfloat16", ... or "off"."""
    return str(dtype).removeprefix("torch.") if dtype else "off"


def resolve_amp(choice: str, device: torch.device) -> AmpChoice:
    """amp.dtype -> the autocast dtype and why (amp_choice.py choose)."""
    if choice == "none":
        return AmpChoice(None, "float32: amp=off")
    from gearshift.engine.amp_choice import choose  # amp=on, bf16, fp16

    return AmpChoice(*choose(choice, device))


class Precision:
    """Runs the forward pass under autocast and the backward/step through a GradScaler,
    enabled for float16 only (engine/loss_scaling.py): bf16 has float32's range. Skipped steps
    (inf/nan gradients) are counted on the device, so counting costs no sync."""

    def __init__(self, dtype: torch.dtype | None, device: torch.device, reason: str = "") -> None:
        self.dtype = dtype
        self.reason = reason  # why this dtype (resolve_amp), for the log and summary.json
        self.device_type = device.type
        self.scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
        self.skipped_steps = torch.zeros((), dtype=torch.int64, device=device)

    def autocast(self) -> AbstractContextManager:
        if self.dtype is None:  # building a disabled torch.autocast costs microseconds a step
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def unscale(self, optimizers: Optimizers) -> None:
        """Divide the gradients by the loss scale now (fp16), so that their norm is the true
        one; the step that follows knows and does not divide again."""
        if self.scaler.is_enabled():
            from gearshift.engine.loss_scaling import unscale  # amp=fp16 only

            unscale(self.scaler, optimizers)

    def step(self, optimizers: Optimizers) -> None:
        if not self.scaler.is_enabled():
            optimizers.step()
            return
        from gearshift.engine.loss_scaling import scaled_step  # amp=fp16 only

        self.skipped_steps += scaled_step(self.scaler, optimizers)

    def metrics(self) -> dict[str, float]:
        """fp16's loss scale and skipped steps for the log, or nothing (host reads: call at
        log steps only)."""
        if not self.scaler.is_enabled():
            return {}
        scale = self.scaler.get_scale()
        return {"amp/grad_scale": scale, "amp/skipped_steps": int(self.skipped_steps)}
