"""Mixed precision (docs/gears.md tip 11): autocast for the forward, a GradScaler for fp16 only."""

from __future__ import annotations

import warnings
from contextlib import AbstractContextManager

import torch

# When GradScaler skips a step (inf/nan gradients, as it does while it finds its scale), the
# schedule still steps; that is intended, and torch's warning about the order is noise here.
warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_amp_dtype(choice: str, device: torch.device) -> torch.dtype | None:
    """amp.dtype -> the autocast dtype; "auto" is bf16 where the device supports it, else fp16."""
    if choice == "none":
        return None
    if choice == "auto":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            return torch.float16
        return torch.bfloat16
    return DTYPES[choice]


class Precision:
    """Runs the forward pass under autocast and the backward/step through a GradScaler.

    The scaler is enabled for float16 only: bf16 has float32's range and needs no scaling.
    Skipped steps (inf/nan gradients) are counted on the device, so counting costs no sync.
    """

    def __init__(self, dtype: torch.dtype | None, device: torch.device) -> None:
        self.dtype = dtype
        self.device_type = device.type
        self.scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
        self.skipped_steps = torch.zeros((), dtype=torch.int64, device=device)

    def autocast(self) -> AbstractContextManager:
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.dtype is not None)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if not self.scaler.is_enabled():
            optimizer.step()
            return
        self.scaler.step(optimizer)
        # The scale only shrinks after a skipped step; compare on the device, never on the host.
        scale_before = self.scaler._scale.clone()
        self.scaler.update()
        self.skipped_steps += (self.scaler._scale < scale_before).long()

    def grad_scale(self) -> float | None:
        """The current loss scale (a host read: call at log steps only)."""
        return self.scaler.get_scale() if self.scaler.is_enabled() else None
