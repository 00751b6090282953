"""Mixed precision (docs/gears.md tip 11): autocast for the forward pass, a GradScaler only for float16.

`amp=on` resolves against the machine it runs on. On CUDA it is bf16 where the GPU supports
it, else fp16. On a CPU, where bf16 and fp16 kernels are native on some chips and emulated
(many times slower than float32) on others, it is bf16 if a short probe measures it about
as fast as float32, else fp16 where the CPU reports native fp16 kernels and the probe
agrees, else float32 itself. Every choice comes with the reason, for the log and
summary.json.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from gearshift.engine.optim import Optimizers

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
SWITCHES = {"none": "amp=off", "auto": "amp=on", "bfloat16": "amp=bf16", "float16": "amp=fp16"}
CPU_CANDIDATES = (torch.bfloat16, torch.float16)  # bf16 first: it needs no GradScaler
# A dtype measured up to this factor slower than float32 counts as just as fast: probe noise.
NOISE = 1.1
_REPS = 10
# A candidate op whose 3 fastest reps are all this much slower than float32, and longer than a
# time slice a busy machine adds to a rep (so no fast op looks slow), is timed no more.
_CONCLUSIVE = 10
_TIME_SLICE_S = 0.02


def short_name(dtype: torch.dtype | None) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", None: "float32"}.get(
        dtype, str(dtype).removeprefix("torch.")
    )


@dataclass(frozen=True)
class CpuSpeed:
    """A dtype's speed on this CPU as a multiple of float32's, for a matmul and a convolution."""

    dtype: torch.dtype
    matmul: float
    conv: float

    @property
    def slowest(self) -> float:
        return min(self.matmul, self.conv)

    @property
    def as_fast_as_float32(self) -> bool:
        return self.slowest * NOISE >= 1

    def describe(self) -> str:
        """e.g. "measured 1.44x float32 (matmul 2.05x, conv 1.44x)"."""
        if self.slowest >= 1:
            overall = f"{self.slowest:.3g}x float32"
        else:
            overall = f"{1 / self.slowest:.3g}x slower than float32"
        return f"measured {overall} (matmul {self.matmul:.3g}x, conv {self.conv:.3g}x)"


def _fastest_seconds(op: Callable[[], object], give_up_s: float = math.inf) -> float:
    """The fastest of up to 10 timed reps after a warm-up; after 3, an op slower than
    `give_up_s` stops (an emulated dtype: 10-40 ms a rep). Not the median: on a shared
    machine a rep that loses its core for a time slice (4-16 ms, 100x a fast op) is common,
    and interference only ever slows a rep down, so the fastest is the op on its own."""
    op()  # warm-up: oneDNN builds its kernels on the first call
    times: list[float] = []
    while len(times) < _REPS and not (len(times) >= 3 and min(times) > give_up_s):
        start = time.perf_counter()
        op()
        times.append(time.perf_counter() - start)
    return min(times)


def _probe_ops(dtype: torch.dtype) -> tuple[Callable[[], object], Callable[[], object]]:
    """A 256x256 matmul and a 3x3 convolution (8x32x16x16) in `dtype`."""
    generator = torch.Generator().manual_seed(0)  # leaves the run's random stream alone
    a, b, images, weight = (
        torch.randn(shape, generator=generator).to(dtype)
        for shape in ((256, 256), (256, 256), (8, 32, 16, 16), (32, 32, 3, 3))
    )
    return (lambda: a @ b), (lambda: F.conv2d(images, weight, padding=1))


@cache
def _float32_seconds() -> tuple[float, float]:
    with torch.inference_mode():
        return tuple(_fastest_seconds(op) for op in _probe_ops(torch.float32))


@cache
def cpu_speed(dtype: torch.dtype) -> CpuSpeed:
    """How fast `dtype` runs here against float32; measured once per process (~10 ms, up to
    ~0.4 s where its kernels are emulated)."""
    base = _float32_seconds()
    with torch.inference_mode():
        seconds = [
            _fastest_seconds(op, give_up_s=max(_CONCLUSIVE * b, _TIME_SLICE_S))
            for op, b in zip(_probe_ops(dtype), base, strict=True)
        ]
    return CpuSpeed(dtype, base[0] / seconds[0], base[1] / seconds[1])


def _native(dtype: torch.dtype) -> bool | None:
    """Whether oneDNN has native kernels for `dtype` on this CPU (None: cannot tell)."""
    check = {
        torch.bfloat16: "_is_mkldnn_bf16_supported",
        torch.float16: "_is_mkldnn_fp16_supported",
    }[dtype]
    try:
        return bool(getattr(torch.ops.mkldnn, check)())
    except (AttributeError, RuntimeError):  # a private check: gone in some builds
        return None


def cpu_kernels(dtype: torch.dtype) -> str:
    """What the CPU offers for `dtype`, e.g. "AVX512, native bf16 kernels"."""
    capability = torch.backends.cpu.get_cpu_capability()
    native = _native(dtype)
    if native is None:
        return capability
    return f"{capability}, {'native' if native else 'emulated'} {short_name(dtype)} kernels"


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


def _choose_on_cpu() -> AmpChoice:
    rejected = []
    for dtype in CPU_CANDIDATES:
        if dtype != torch.bfloat16 and not _native(dtype):  # x86 without AVX512-FP16/AMX-FP16
            rejected.append(f"{short_name(dtype)}: no native kernels reported, not measured")
            continue
        speed = cpu_speed(dtype)
        measured = f"{speed.describe()} on this CPU ({cpu_kernels(dtype)})"
        if speed.as_fast_as_float32:
            return AmpChoice(dtype, f"{short_name(dtype)}: {measured}")
        rejected.append(f"{short_name(dtype)} {measured}")
    return AmpChoice(None, "float32: " + "; ".join(rejected))


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
        return _choose_on_cpu()
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
