"""amp=on's probe on a CPU: how fast bf16 and fp16 run here against float32, and whether
oneDNN has native kernels for them. On some chips their kernels are native, on others
emulated (many times slower than float32); amp=on's choice here (`choose_on_cpu`, for
amp_choice.py's choose) and the advisor's amp rule read it. Loaded only where amp=on
resolves on a CPU, or the advisor judges amp=bf16/fp16 there.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import torch
import torch.nn.functional as F

CANDIDATES = (torch.bfloat16, torch.float16)  # bf16 first: it needs no GradScaler
# A dtype measured up to this factor slower than float32 counts as just as fast: probe noise.
NOISE = 1.1
_REPS = 10
# A candidate op whose 3 fastest reps are all this much slower than float32, and longer than a
# time slice a busy machine adds to a rep (so no fast op looks slow), is timed no more.
_CONCLUSIVE = 10
_TIME_SLICE_S = 0.02


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


def native_kernels(dtype: torch.dtype) -> bool | None:
    """Whether oneDNN has native kernels for `dtype` on this CPU (None: cannot tell)."""
    check = {
        torch.bfloat16: "_is_mkldnn_bf16_supported",
        torch.float16: "_is_mkldnn_fp16_supported",
    }[dtype]
    try:
        return bool(getattr(torch.ops.mkldnn, check)())
    except (AttributeError, RuntimeError):  # a private check: gone in some builds
        return None


def cpu_kernels(dtype: torch.dtype, name: str) -> str:
    """What the CPU offers for `dtype` (`name`: its short name), e.g. "AVX512, native bf16
    kernels"."""
    capability = torch.backends.cpu.get_cpu_capability()
    native = native_kernels(dtype)
    if native is None:
        return capability
    return f"{capability}, {'native' if native else 'emulated'} {name} kernels"


def choose_on_cpu(short_name: Callable[[torch.dtype], str]) -> tuple[torch.dtype | None, str]:
    """amp=on on this CPU: the first candidate measured about as fast as float32 (fp16 only
    where native kernels are reported), else float32 (None); with the reason, each dtype
    named by `short_name` (amp_choice.py's)."""
    rejected = []
    for dtype in CANDIDATES:
        name = short_name(dtype)
        # x86 without AVX512-FP16/AMX-FP16 reports none for fp16
        if dtype != torch.bfloat16 and not native_kernels(dtype):
            rejected.append(f"{name}: no native kernels reported, not measured")
            continue
        speed = cpu_speed(dtype)
        measured = f"{speed.describe()} on this CPU ({cpu_kernels(dtype, name)})"
        if speed.as_fast_as_float32:
            return dtype, f"{name}: {measured}"
        rejected.append(f"{name} {measured}")
    return None, "float32: " + "; ".join(rejected)
