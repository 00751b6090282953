"""Mixed precision (docs/gears.md tip 11): autocast for the forward pass, a GradScaler only for float16.

`amp=on` resolves against the machine it runs on. On CUDA it is bf16 where the GPU supports
it, else fp16. On a CPU, where bf16 and fp16 kernels are native on some chips and emulated
(many times slower than float32) on others, it is bf16 if a short probe (cpu_probe.py, loaded
then only) measures it about as fast as float32, else fp16 where the CPU reports native fp16 kernels and the probe
agrees, else float32 itself. Every choice comes with the reason, for the log and
summary.json.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from gearshift.engine.optim import Optimizers

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
SWITCHES = {"none": "amp=off", "auto": "amp=on", "bfloat16": "amp=bf16", "float16": "amp=fp16"}


def short_name(dtype: torch.dtype | None) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", None: "float32"}.get(
        dtype, str(dtype).removeprefix("torch.")
    )


@dataclass(frozen=True)
class AmpChoice:
    dtype: torch.dtype | None  # None: float32, no autocast
    reason: str  # why, in words, for the log and summary.json

    @property
    def name(self) -> str:
        return amp_name(self.dtype)


def amp_name(dtype: torch.dtype | None) -> str:
    """The resolved amp switch as summary.json's gears name it: "bfloat16", ... or "off"."""
    return str(dtype).removeprefix("torch.") if dtype else "off"


def _choose_on_accelerator(device: torch.device) -> AmpChoice:
    if device.type != "cuda":
        return AmpChoice(torch.bfloat16, f"bf16: autocast's usual dtype on {device.type}")
    if torch.cuda.is_bf16_supported():
        return AmpChoice(torch.bfloat16, "bf16: this GPU supports it")
    return AmpChoice(torch.float16, "fp16 with a GradScaler: this GPU has no bf16")


def resolve_amp(choice: str, device: torch.device) -> AmpChoice:
    """amp.dtype -> the autocast dtype and why. "auto" (amp=on) resolves against the device:
    never a dtype a CPU measures slower than float32; bf16/fp16 are forced as asked."""
    if choice == "none":
        return AmpChoice(None, "float32: amp=off")
    if choice != "auto":
        dtype = DTYPES[choice]
        return AmpChoice(dtype, f"{short_name(dtype)}: forced by {SWITCHES[choice]}")
    if device.type == "cpu":
        from gearshift.engine.cpu_probe import choose_on_cpu  # measured here only

        return AmpChoice(*choose_on_cpu(short_name))
    return _choose_on_accelerator(device)


def resolve_amp_dtype(choice: str, device: torch.device) -> torch.dtype | None:
    """amp.dtype -> the autocast dtype (see resolve_amp)."""
    return resolve_amp(choice, device).dtype


class Precision:
    """Runs the forward pass under autocast and the backward/step through a GradScaler.

    The scaler is enabled for float16 only: bf16 has float32's range and needs no scaling.
    Skipped steps (inf/nan gradients) are counted on the device, so counting costs no sync.
    """

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
            optimizers.unscale_(self.scaler)

    def step(self, optimizers: Optimizers) -> None:
        if not self.scaler.is_enabled():
            optimizers.step()
            return
        optimizers.step(self.scaler)
        # The scale only shrinks after a skipped step; compare on the device, never on the host.
        scale_before = self.scaler._scale.clone()
        self.scaler.update()  # once for all the optimizers: their inf/nan checks combined
        self.skipped_steps += (self.scaler._scale < scale_before).long()

    def grad_scale(self) -> float | None:
        """The current loss scale (a host read: call at log steps only)."""
        return self.scaler.get_scale() if self.scaler.is_enabled() else None

    def metrics(self) -> dict[str, float]:
        """fp16's loss scale and skipped steps for the log, or nothing (host reads: call at
        log steps only)."""
        if not self.scaler.is_enabled():
            return {}
        return {"amp/grad_scale": self.grad_scale(), "amp/skipped_steps": int(self.skipped_steps)}
