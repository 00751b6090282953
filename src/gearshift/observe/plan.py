"""`plan=on`: a run's memory and step time, known before it launches (docs/planning.md).

The run's model, optimizer, precision, memory format, accumulation and activation
checkpointing are built as the config says, but under FakeTensorMode: tensors with shapes,
dtypes and devices and no memory behind them. Two optimizer steps run on the task's example
batches inside torch's MemTracker (peak bytes per device by category: parameters, gradients,
optimizer state, activations, temporaries) and the roofline timer (observe/roofline.py).
A second trace at twice the batch gives the memory each sample adds, so the largest batch
that fits with `plan.headroom` free follows. FSDP's shares of parameters, gradients and
optimizer state are 1/world_size, computed: one process plans for any number of ranks.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from gearshift.config import ConfigError
from gearshift.config.schema import PLAN_DEVICES
from gearshift.data.loading import to_device
from gearshift.engine.optim import build_optimizers, clip_grad_norm
from gearshift.engine.precision import resolve_amp
from gearshift.engine.runtime import resolve_device
from gearshift.models.blocks import model_blocks
from gearshift.models.factory import instantiate_model
from gearshift.observe.gpu_datasheets import GPU_MEMORY, gpu_model, gpu_peak
from gearshift.observe.mfu import peak_flops
from gearshift.observe.roofline import Roofline
from gearshift.tasks import Task, build_task

log = logging.getLogger(__name__)

MIB = 2**20
STEP = 8  # the largest batch is a multiple of 8, as batch_size=auto's
# MemTracker's categories -> the plan's
CATEGORIES = {
    "Parameter": "parameters", "Buffer": "parameters", "Gradient": "gradients",
    "Optstate": "optimizer_state", "Activation": "activations", "Temp": "temporaries",
    "Other": "temporaries",
}  # fmt: skip
SHARDED = ("parameters", "gradients", "optimizer_state")  # FSDP: 1/world_size of each


@dataclass
class Target:
    """The device a plan is for, and the one the fake tensors are traced on."""

    name: str
    memory_bytes: float
    bandwidth: float  # bytes/s
    gpu: str | None  # the row of observe/gpu_datasheets.py's tables; None: the CPU
    trace_device: torch.device  # the target where it is here, else the CPU (same bytes)


@cache
def cpu_bandwidth() -> float:
    """Bytes/s of a 64 MiB copy on this CPU (read + write), the best of five."""
    source = torch.empty(64 * MIB, dtype=torch.uint8)
    target = torch.empty_like(source)
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - start)
    return 2 * source.nbytes / best


def resolve_target(cfg: DictConfig) -> Target:
    name = cfg.plan.device
    if name == "auto":
        device = resolve_device(cfg.device)
        if device.type == "cuda":
            gpu = gpu_model(torch.cuda.get_device_name(device))
            if gpu is None:
                choices = ", ".join(PLAN_DEVICES[2:])
                raise ConfigError(
                    f"plan.device=auto is not allowed; {torch.cuda.get_device_name(device)} "
                    f"is not in observe/gpu_datasheets.py's table: name the nearest of {choices}"
                )
            memory = torch.cuda.get_device_properties(device).total_memory
            return Target(gpu, memory, GPU_MEMORY[gpu][1] * 1e12, gpu, device)
        name = "cpu"
    if name == "cpu":
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return Target("cpu", memory, cpu_bandwidth(), None, torch.device("cpu"))
    gpu = gpu_model(name)
    memory, bandwidth = GPU_MEMORY[gpu]
    here = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    return Target(gpu, memory * 1e9, bandwidth * 1e12, gpu, here)


def planned_dtype(cfg: DictConfig, target: Target) -> torch.dtype | None:
    """The autocast dtype the run would use there: amp=on (auto) resolves as on the target."""
    if target.gpu is None or cfg.amp.dtype != "auto":
        return resolve_amp(cfg.amp.dtype, target.trace_device).dtype
    return torch.bfloat16 if gpu_peak(target.gpu, "bfloat16")[0] else torch.float16


def planned_compute_dtype(
    cfg: DictConfig, target: Target, dtype: torch.dtype | None, convs: bool
) -> str:
    """The dtype of the matmuls, for the peak: autocast's; on a GPU TF32 where torch uses it."""
    if dtype is not None:
        return str(dtype).removeprefix("torch.")
    tf32 = cfg.matmul_precision != "highest" or convs  # cuDNN's convolutions: TF32 by default
    return "tf32" if target.gpu and tf32 else "float32"


def _in_memory_format(model: nn.Module, memory_format: torch.memory_format) -> None:
    """Module.to(memory_format=) swaps parameters, which fake ones refuse: re-wrap them."""
    if memory_format == torch.contiguous_format:
        return
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            if p.dim() == 4:
                weight = p.detach().contiguous(memory_format=memory_format)
                setattr(module, name, nn.Parameter(weight, requires_grad=p.requires_grad))


@dataclass
class Trace:
    peak: dict[str, float]  # bytes by the plan's categories at the peak
    roofline: Roofline | None  # the operators of the last optimizer step
    block_bytes: list[int] = field(default_factory=list)  # each block's parameters (FSDP)
    convs: bool = False

    @property
    def total(self) -> float:
        return sum(self.peak.values())


def _step(
    cfg, model, optimizers, task: Task, batch_size: int, accum: int, dtype, device, tracker
) -> None:
    """One optimizer step as train.py's loop takes it: accum micro-batches, clipping, update."""
    memory_format = torch.channels_last if cfg.memory_format.channels_last else None
    for _ in range(accum):
        batch = task.example_batch(batch_size, device)
        batch = to_device(batch, device, False, memory_format or torch.contiguous_format)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss, _ = task.loss_terms(model, batch)
        (loss / accum).backward()
        tracker.reset_mod_stats()  # MemTracker follows one forward and backward at a time
    if cfg.optimizer.clip_grad_norm:
        clip_grad_norm(model.parameters(), cfg.optimizer.clip_grad_norm)
    optimizers.step()
    optimizers.zero_grad(set_to_none=cfg.optimizer.set_to_none)


def trace(
    cfg: DictConfig, task: Task, target: Target, dtype, batch_size: int, accum: int,
    timed: bool = True,
) -> Trace:  # fmt: skip
    """Two optimizer steps under fake tensors: the peak by category; `timed`: the second's
    operators for the roofline."""
    # here, not at the top: it imports torch._inductor and torch._dynamo, which cost every run
    # (batch_finder imports this module) about as much again as importing torch
    from torch.distributed._tools.mem_tracker import MemTracker

    device = target.trace_device
    memory_format = torch.channels_last if cfg.memory_format.channels_last else None
    with FakeTensorMode(), device:
        model = instantiate_model(cfg.model)
        _in_memory_format(model, memory_format or torch.contiguous_format)
        model.train()
        optimizers = build_optimizers(model, cfg.optimizer)
        tracker = MemTracker()
        tracker.track_external(model, *optimizers.optimizers)
        roofline = Roofline() if timed else None
        with tracker, roofline or nullcontext():
            for _ in range(2):  # the second runs with the optimizer state in place
                if roofline:
                    roofline.restart()
                _step(cfg, model, optimizers, task, batch_size, accum, dtype, device, tracker)
        (snapshot,) = tracker.get_tracker_snapshot("peak").values()
    peak = dict.fromkeys(CATEGORIES.values(), 0.0)
    for kind, value in snapshot.items():
        if kind != "Total":
            peak[CATEGORIES[str(kind.value)]] += value
    blocks = [sum(p.nbytes for p in b.parameters()) for b in model_blocks(model)]
    convs = any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())
    return Trace(peak, roofline, blocks, convs)


def run_strategy(cfg: DictConfig, world_size: int) -> str:
    """distributed.strategy as the run resolves it: auto is DDP on several ranks."""
    strategy = cfg.distributed.strategy
    return ("ddp" if world_size > 1 else "none") if strategy == "auto" else strategy


def run_world_size(cfg: DictConfig) -> int:
    """plan.world_size, else the run's: nproc_per_node, or the launcher's WORLD_SIZE."""
    if cfg.plan.world_size is not None:
        return cfg.plan.world_size
    return max(cfg.distributed.nproc_per_node, int(os.environ.get("WORLD_SIZE", "1")))


def per_device(traced: Trace, strategy: str, world_size: int, cfg: DictConfig) -> dict[str, float]:
    """One device's peak by category under the strategy: FSDP holds 1/world_size of the
    parameters, gradients and optimizer state, plus the two largest units' parameters
    all-gathered (one in use, one prefetched); DDP adds its gradient buckets (a copy of
    the gradients) unless they are views of them."""
    peak = dict(traced.peak)
    if strategy == "fsdp" and world_size > 1:
        for key in SHARDED:
            peak[key] /= world_size
        params = traced.peak["parameters"]
        units = sorted([*traced.block_bytes, params - sum(traced.block_bytes)], reverse=True)
        peak["temporaries"] += sum(units[:2]) * (1 - 1 / world_size)
    elif strategy == "ddp" and not cfg.distributed.gradient_as_bucket_view:
        peak["temporaries"] += traced.peak["gradients"]
    return peak


def largest_batch(fixed: float, per_sample: float, budget: float) -> int | None:
    """The largest batch whose peak stays within `budget` (a multiple of 8 from 8 on)."""
    if per_sample <= 0:
        return None
    largest = max(0, math.floor((budget - fixed) / per_sample))
    return largest // STEP * STEP if largest >= STEP else largest


@dataclass
class Plan:
    device: str
    traced_on: str
    world_size: int
    strategy: str
    batch_size: int  # per device: the project's batch_size is each rank's
    accum: int
    amp: str
    memory: dict[str, float]  # bytes per device at the peak, by category
    peak_bytes: float
    device_memory_bytes: float
    headroom: float
    fits: bool
    largest_batch_size: int | None
    bytes_per_sample: float  # at the largest batch: what one more sample adds
    step_time_s: float | None  # the roofline's: a lower bound
    samples_per_sec_per_device: float | None
    samples_per_sec: float | None  # every rank's
    flops_per_step: float
    bytes_per_step: float
    peak_flops_per_sec: float | None
    bandwidth: float
    advice: list[str]  # the memory gears not yet on, when it does not fit
    plan_seconds: float  # how long planning took

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _traced(cfg, task, target, dtype, batch_size: int, accum: int, timed: bool) -> Trace:
    """`trace`, with what fake tensors cannot run said in one line naming the operator."""
    try:
        return trace(cfg, task, target, dtype, batch_size, accum, timed)
    except ConfigError:
        raise
    except Exception as error:  # the model's own code: any op may lack a fake kernel
        cause = error
        while getattr(cause, "func", None) is None and cause.__cause__ is not None:
            cause = cause.__cause__
        op = getattr(cause, "func", None)
        what = f"operator {op} ({type(cause).__name__})" if op else str(error).splitlines()[0]
        raise ConfigError(
            f"model._target_={cfg.model.get('_target_')} is not allowed; plan=on runs it "
            f"under fake tensors, and {what} cannot run there: plan without it"
        ) from error


def advice(
    cfg: DictConfig, traced: Trace, dtype, strategy: str, batch_size: int, largest: int | None
) -> list[str]:
    """The memory gears not on yet, most saving first where the plan does not fit."""
    gears = []
    if not cfg.model.get("checkpointing") and traced.block_bytes:
        gears.append("model.checkpointing=true (recompute each block's activations)")
    if dtype is None:
        gears.append("amp=bf16 (activations in half the bytes)")
    if strategy != "fsdp":
        gears.append("distributed=fsdp (parameters, gradients, optimizer state / ranks)")
    if largest:
        gears.append(same_samples_a_step(batch_size * cfg.accum, largest))
    return gears


def same_samples_a_step(samples: int, largest: int) -> str:
    """batch_size=N accum=M with N x M exactly `samples` and N the largest such batch up to
    `largest`; where that N is below half of what fits (61 samples: only 1 x 61), it says
    that no batch and accumulation near the largest make the samples a step."""
    fits = min(samples, largest)
    batch = max(n for n in range(1, fits + 1) if samples % n == 0)
    if 2 * batch < fits:
        return (
            f"batch_size<={largest} (no batch from {fits - fits // 2} to {fits} times an "
            f"accum makes the {samples} samples a step)"
        )
    return f"batch_size={batch} accum={samples // batch} (the same {samples} samples a step)"


def make_plan(cfg: DictConfig, task: Task | None = None, budget: float | None = None) -> Plan:
    """The plan of the run `cfg` describes, for plan.device at plan.world_size; the largest
    batch within `budget` bytes (default: the device's memory less plan.headroom)."""
    start = time.perf_counter()
    task = task or build_task(cfg.task)
    target = resolve_target(cfg)
    world_size = run_world_size(cfg)
    strategy = run_strategy(cfg, world_size)
    dtype = planned_dtype(cfg, target)
    batch = cfg.batch_size if isinstance(cfg.batch_size, int) else STEP  # auto: from 8
    traced = _traced(cfg, task, target, dtype, batch, cfg.accum, timed=True)
    memory = per_device(traced, strategy, world_size, cfg)
    peak = sum(memory.values())

    def peak_at(n: int) -> float:
        at_n = _traced(cfg, task, target, dtype, n, cfg.accum, timed=False)
        return sum(per_device(at_n, strategy, world_size, cfg).values())

    budget = budget or target.memory_bytes * (1 - cfg.plan.headroom)
    largest, per_sample = search_largest(peak_at, (batch, peak), budget)
    dtype_name = planned_compute_dtype(cfg, target, dtype, traced.convs)
    if target.gpu:
        peak_rate = gpu_peak(target.gpu, dtype_name)[0]
    else:
        peak_rate = peak_flops(torch.device("cpu"), dtype_name, cfg.matmul_precision)[0]
    flops, moved = traced.roofline.totals()
    seconds = traced.roofline.seconds(peak_rate, target.bandwidth) if peak_rate else None
    rate = batch * cfg.accum / seconds if seconds else None
    fits = peak <= budget
    return Plan(
        target.name, str(target.trace_device), world_size, strategy, batch, cfg.accum,
        "off" if dtype is None else str(dtype).removeprefix("torch."), memory, peak,
        target.memory_bytes, cfg.plan.headroom, fits, largest, per_sample, seconds, rate,
        rate * world_size if rate else None, flops, moved, peak_rate, target.bandwidth,
        [] if fits else advice(cfg, traced, dtype, strategy, batch, largest),
        time.perf_counter() - start,
    )  # fmt: skip


def search_largest(
    peak_at: Callable[[int], float], traced: tuple[int, float], budget: float, rounds: int = 3
) -> tuple[int | None, float]:
    """(the largest batch within `budget`, bytes per sample there) by secant steps on the
    traced peak: the line through the last two traced sizes names the next size to trace.
    A line from small batches alone misses where the peak's slope changes (the optimizer
    step's peak, then the backward's), and fake tensors trace any size at the same cost."""
    points = [traced, (2 * traced[0], peak_at(2 * traced[0]))]
    largest = None
    for _ in range(rounds):
        (n0, p0), (n1, p1) = points[-2:]
        per_sample = (p1 - p0) / (n1 - n0)
        largest = largest_batch(p1 - per_sample * n1, per_sample, budget)
        if not largest or largest in (n0, n1):
            break
        points.append((largest, peak_at(largest)))
    (n0, p0), (n1, p1) = points[-2:]
    per_sample = (p1 - p0) / (n1 - n0)
    return largest_batch(p1 - per_sample * n1, per_sample, budget), per_sample


def log_plan(plan: Plan, console: Any = None) -> None:
    """The plan through logging, and as a table on the console (rich)."""
    from rich.console import Console
    from rich.table import Table

    gib = 2**30
    log.info(
        "plan: %s x %d (%s), batch %d x accum %d per device, amp %s: peak %.2f GiB of %.1f GiB "
        "(%s with %.0f%% headroom); largest batch %s",
        plan.device, plan.world_size, plan.strategy, plan.batch_size, plan.accum, plan.amp,
        plan.peak_bytes / gib, plan.device_memory_bytes / gib,
        "fits" if plan.fits else "does NOT fit", plan.headroom * 100, plan.largest_batch_size,
    )  # fmt: skip
    log.info(
        "plan: %s",
        ", ".join(f"{key} {value / MIB:,.1f} MiB" for key, value in plan.memory.items()),
    )
    if plan.step_time_s:
        log.info(
            "plan: step %.2f ms by the roofline (a lower bound), %.1f samples/s per device, "
            "%.1f in all; traced on %s in %.1f s",
            plan.step_time_s * 1e3, plan.samples_per_sec_per_device, plan.samples_per_sec,
            plan.traced_on, plan.plan_seconds,
        )  # fmt: skip
    for gear in plan.advice:
        log.warning("plan: to make it fit, try %s", gear)
    table = Table(title=f"plan: {plan.device} x {plan.world_size}", title_justify="left")
    table.add_column("per device")
    table.add_column("MiB", justify="right")
    for key, value in [*plan.memory.items(), ("peak", plan.peak_bytes)]:
        table.add_row(key.replace("_", " "), f"{value / MIB:,.1f}")
    (console or Console(stderr=True)).print(table)


@dataclass
class PlanCheck:
    """plan.check=true: the plan of a run beside what the run measured (summary.json `plan`).

    On CUDA the measured peak is the run's own (max_memory_allocated); on a CPU, whose
    figure is the process's RSS, it is the tensor bytes of one tracked real step
    (batch_finder.py's tally, `measured_peak_bytes`) taken at start-up."""

    plan: Plan
    measured_peak_bytes: int | None = None  # CPU: a tracked real step's; None: the run's

    def summary(self, summary: dict[str, Any]) -> dict[str, Any]:
        cuda = summary["peak_memory_kind"] == "cuda_allocated"
        measured = summary["peak_memory_bytes"] if cuda else self.measured_peak_bytes
        step_s = summary["step_time_ms"] / 1e3
        predicted_s = self.plan.step_time_s
        return {
            "device": self.plan.device,
            "predicted_peak_bytes": self.plan.peak_bytes,
            "measured_peak_bytes": measured,
            "measured_peak_kind": "cuda_allocated" if cuda else "tensor_bytes_of_a_real_step",
            "peak_ratio": self.plan.peak_bytes / measured if measured else None,
            "predicted_step_time_s": predicted_s,
            "measured_step_time_s": step_s,
            "step_time_ratio": predicted_s / step_s if predicted_s and step_s else None,
            "plan_seconds": self.plan.plan_seconds,
        }
