"""Model FLOPs utilisation: FLOPs per sample, counted once at start-up (FlopCounterMode over
the example batch's forward and backward) or a transformer's own count (analytic_flops.py),
against the device's peak for the dtype the matmuls run in (docs/observing.md: the
summary's `flops_*`, `peak_flops_*` and `mfu`; `perf/mfu` at log steps, no extra sync)."""

from __future__ import annotations

import logging
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from gearshift.data.loading import to_device
from gearshift.engine.precision import Precision
from gearshift.models.blocks import recompute_disabled
from gearshift.tasks import Task

log = logging.getLogger(__name__)

_aten = torch.ops.aten


def _as_counted(flash_op) -> Callable[..., int]:
    """A CUDA flash-attention op's registered formula, lent to the CPU op of the same maths:
    FlopCounterMode has none for the CPU's kernels, so attention counts on both devices."""
    count = partial(flop_registry[flash_op])  # takes tensors already (wrapped when registered)
    count._get_raw = True  # FlopCounterMode: do not wrap it a second time
    return count


CPU_ATTENTION_FLOPS = {
    _aten._scaled_dot_product_flash_attention_for_cpu: _as_counted(
        _aten._scaled_dot_product_flash_attention
    ),
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: _as_counted(
        _aten._scaled_dot_product_flash_attention_backward
    ),
}


@cache
def cpu_matmul_peak(dtype: torch.dtype, matmul_precision: str, threads: int) -> tuple[float, int]:
    """(best FLOP/s, n) of n x n matmuls in `dtype`, measured here once per process. n doubles
    from 256 to 2048 while the next size would take under a quarter second: every run on a CPU
    pays this at start (about half a second on one core; a 1024 matmul there is within a few
    percent of a 2048's rate), and a dtype the CPU has no fast kernels for (float16 on most)
    costs no more."""
    n, g = 256, torch.Generator().manual_seed(0)  # its own stream: the run's stays untouched
    while True:
        a, b = (torch.randn(n, n, generator=g).to(dtype) for _ in range(2))
        matmul = partial(torch.mm, a, b)
        matmul()  # warm up: kernels and caches
        best = timeit.timeit(matmul, number=1)
        if n >= 2048 or best * 8 > 0.25:
            break
        n *= 2
    repeats = timeit.repeat(matmul, number=1, repeat=4 if best < 0.25 else 1)
    return 2 * n**3 / min(best, *repeats), n


def compute_dtype(precision: Precision, device: torch.device, model: nn.Module) -> str:
    """The dtype the matmuls and convolutions run in: autocast's, TF32, or float32."""
    if precision.dtype is not None:
        return str(precision.dtype).removeprefix("torch.")
    if device.type == "cuda":
        has_conv = any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())
        if torch.backends.cuda.matmul.allow_tf32 or (torch.backends.cudnn.allow_tf32 and has_conv):
            return "tf32"  # matmul_precision=high, or cuDNN's convolutions (TF32 by default)
    return "float32"


def peak_flops(device: torch.device, dtype: str, matmul_precision: str) -> tuple[float | None, str]:
    if device.type == "cuda":
        from gearshift.observe.gpu_datasheets import gpu_peak  # CUDA only

        return gpu_peak(torch.cuda.get_device_name(device), dtype)
    if device.type == "cpu":
        threads = torch.get_num_threads()
        peak, n = cpu_matmul_peak(getattr(torch, dtype), matmul_precision, threads)
        return peak, f"measured: {dtype} matmul {n}x{n} on {threads} CPU threads"
    return None, f"no peak known for device type {device.type!r}"


def count_flops_per_sample(
    model: nn.Module,
    task: Task,
    device: torch.device,
    precision: Precision,
    memory_format: torch.memory_format,
) -> float:
    """Forward + backward FLOPs of one training sample, counted on the task's example batch of
    two samples, on detached copies of the parameters and buffers: the model's gradients and
    BatchNorm statistics are left as they were, and so is the run's random stream."""
    state = {
        name: p.detach().requires_grad_(p.requires_grad) for name, p in model.named_parameters()
    }
    state |= {name: b.clone() for name, b in model.named_buffers()}

    def detached_model(*args):
        return functional_call(model, state, args)

    counting = FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        batch = task.example_batch(2, device)  # two: BatchNorm needs more than one in training
        batch = to_device(batch, device, False, memory_format)
        with counting as counter, recompute_disabled():
            with precision.autocast():
                loss, _ = task.loss_terms(detached_model, batch)
            loss.backward()
    return counter.get_total_flops() / task.count(batch)


COUNTED = "counted: FlopCounterMode over a forward and backward pass"


@dataclass
class MFU:
    flops_per_sample: float  # the one MFU uses: the analytical count where there is one
    peak_flops_per_sec: float | None
    peak_flops_source: str
    flops_source: str = COUNTED
    counted_flops_per_sample: float | None = None
    analytic_flops_per_sample: float | None = None

    @classmethod
    def measure(
        cls,
        model: nn.Module,
        task: Task,
        matmul_precision: str,
        device: torch.device,
        precision: Precision,
        memory_format: torch.memory_format,
        strategy: str = "none",
    ) -> MFU:
        counted = count_flops_per_sample(model, task, device, precision, memory_format)
        flops, flops_source, analytic = counted, COUNTED, None
        if callable(getattr(model, "flops_per_token", None)):  # a transformer's own count
            from gearshift.observe.analytic_flops import ANALYTIC, analytic_flops_per_sample

            flops = analytic = analytic_flops_per_sample(model, task, device)
            flops_source = ANALYTIC
        dtype = compute_dtype(precision, device, model)
        peak, source = peak_flops(device, dtype, matmul_precision)
        if peak and strategy == "dp" and torch.cuda.device_count() > 1:
            # DataParallel: one process, so "per device" figures cover all its GPUs
            peak *= torch.cuda.device_count()
            source += f" x {torch.cuda.device_count()} GPUs (DataParallel)"
        log.info(
            "%.3g FLOPs per sample (forward + backward, %s%s); peak %s FLOP/s (%s)",
            flops,
            flops_source.split(":")[0],
            "" if analytic is None else f"; counted {counted:.3g}",
            f"{peak:.3g}" if peak else "unknown",
            source,
        )
        return cls(flops, peak, source, flops_source, counted, analytic)

    def of(self, samples_per_sec: float) -> float | None:
        peak = self.peak_flops_per_sec
        return self.flops_per_sample * samples_per_sec / peak if peak else None

    def metrics(self, samples_per_sec: float) -> dict[str, float]:
        """`perf/mfu` for a log step, where the peak is known."""
        mfu = self.of(samples_per_sec)
        return {} if mfu is None else {"perf/mfu": mfu}

    def summary(self, samples_per_sec_per_device: float) -> dict[str, Any]:
        """The figures at the run's throughput; MFU is never clamped (docs/observing.md,
        `peak_flops_beaten`: a CPU's start-up probe may run while the machine is busier)."""
        mfu = self.of(samples_per_sec_per_device)
        return {
            "flops_per_sample": self.flops_per_sample,
            "flops_source": self.flops_source,
            "flops_per_sample_counted": self.counted_flops_per_sample,
            "flops_per_sample_analytic": self.analytic_flops_per_sample,
            "achieved_flops_per_sec": self.flops_per_sample * samples_per_sec_per_device,
            "peak_flops_per_sec": self.peak_flops_per_sec,
            "peak_flops_source": self.peak_flops_source,
            "mfu": mfu,
            "peak_flops_beaten": None if mfu is None else mfu > 1,
        }
