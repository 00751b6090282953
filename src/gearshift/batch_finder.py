"""`batch_size=auto`: the largest multiple of 8 that fits (docs/gears.md tip 10: fill the memory).

CUDA: real training steps (forward, backward, optimizer step) on a probe copy of the
model at growing batch sizes, doubling from 8 until one runs out of memory (or its peak
allocated memory passes `batch_size_finder.max_memory_gib`), then a bisection in steps of
8; the answer backs off by `margin` from the largest size that fit, for the allocator's
fragmentation and whatever the real run adds.

CPU: there is no out-of-memory error to catch (the machine swaps, or the kernel kills the
process), so the size is bounded by a budget instead: `max_memory_gib`, or by default
`memory_fraction` of the RAM available now. A probe measures the peak heap in use during
real steps at two small batch sizes (every tensor the operators allocate, counted until it
is freed), which gives the memory per sample and the fixed part (model, gradients,
optimizer state); the estimate plus `margin` must stay within the budget.

Either way the size is capped by the training set and `max_batch_size`, the probe leaves
the random number generators as it found them, and its memory is released before the run.
"""

from __future__ import annotations

import gc
import logging
import os
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch
from omegaconf import DictConfig
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from gearshift.config import ConfigError
from gearshift.config.schema import BatchSizeFinderConfig
from gearshift.data.loading import to_device
from gearshift.engine.optim import Optimizers, build_optimizers
from gearshift.engine.precision import Precision
from gearshift.models.factory import build_model
from gearshift.parallel.distributed import gather_sum_max
from gearshift.tasks import Task

log = logging.getLogger(__name__)

STEP = 8  # tip 10: multiples of 8 map onto tensor-core and vector tiles
GIB = 2**30


@dataclass
class BatchSizeChoice:
    batch_size: int
    # what stopped the search: out_of_memory | memory_budget | dataset | max_batch_size |
    # another_rank (DDP: the smallest rank's size wins) | resumed_checkpoint
    bound: str
    budget_bytes: int | None = None  # the memory it had to fit in, where there was one
    bytes_per_sample: float | None = None  # CPU: the memory each sample adds at the peak
    fixed_bytes: float | None = None  # CPU: the peak's part that does not grow with the batch

    def as_dict(self) -> dict:
        return asdict(self)


def largest_fitting(
    fits: Callable[[int], bool], cap: int, step: int = STEP, start: int | None = None
) -> int:
    """The largest multiple of `step` <= `cap` (itself one) with fits(n); 0 if not even `step`.

    Doubles from `step` while sizes fit, then bisects between the last fit and the first
    failure; `fits` is assumed monotone (what fits at n fits below n). `start`, a planned
    size (observe/plan.py), brackets the answer first: it and a quarter above it (or below
    it), so a good plan leaves a short bisection instead of the doublings.
    """
    good, n, failed = 0, step, False
    if start is not None and step <= start < cap:
        good, n, failed = _bracket(fits, start, cap, step)
    while not failed and n < cap and fits(n):
        good, n = n, 2 * n
    if n >= cap:
        if fits(cap):
            return cap
        n = cap
    bad = n
    while bad - good > step:
        middle = (good + bad) // (2 * step) * step
        if fits(middle):
            good = middle
        else:
            bad = middle
    return good


def _bracket(fits: Callable[[int], bool], start: int, cap: int, step: int) -> tuple[int, int, bool]:
    """(the largest size known to fit or 0, the next size up: to try, or known not to fit,
    and whether it is known not to fit) around the planned `start`."""
    start = max(step, start // step * step)
    if fits(start):
        return start, min(cap, -(-start * 5 // 4 // step) * step), False
    bad, n = start, max(step, start * 4 // 5 // step * step)
    while n < bad:  # the plan was too hopeful: down by a fifth, then by halves
        if fits(n):
            return n, bad, True
        bad, n = n, max(step, n // 2 // step * step)
    return 0, bad, True


def size_cap(finder: BatchSizeFinderConfig, num_samples: int | None) -> tuple[int, str]:
    """(largest size worth trying, why): the training set or max_batch_size, a multiple of 8."""
    num_samples = num_samples or finder.max_batch_size
    by_data = max(STEP, num_samples // STEP * STEP)
    by_config = finder.max_batch_size // STEP * STEP
    return (by_data, "dataset") if by_data <= by_config else (by_config, "max_batch_size")


class _Probe:
    """A copy of the model and its optimizers (built from the model and optimizer nodes),
    run for real steps on the task's example batches."""

    def __init__(
        self, model_cfg: DictConfig, optimizer_cfg: DictConfig, task: Task, device,
        precision_dtype, memory_format,
    ) -> None:  # fmt: skip
        self.device, self.memory_format, self.task = device, memory_format, task
        self.model = build_model(model_cfg, device, memory_format)
        self.model.train()
        self.optimizers = build_optimizers(self.model, optimizer_cfg)
        self.precision = Precision(precision_dtype, device)  # its own GradScaler

    def forward_backward(self, batch_size: int) -> None:
        batch = self.task.example_batch(batch_size, self.device)
        batch = to_device(batch, self.device, False, self.memory_format)
        with self.precision.autocast():
            loss, _ = self.task.loss_terms(self.model, batch)
        self.precision.backward(loss)

    def optimizer_step(self) -> None:
        self.precision.step(self.optimizers)
        self.optimizers.zero_grad(set_to_none=True)

    def steps(self, batch_size: int, count: int) -> None:
        for _ in range(count):
            self.forward_backward(batch_size)
            self.optimizer_step()


Plan = Callable[[int], int | None]  # bytes -> the largest batch the plan fits in them


def planned_start(plan: Plan | None, device: torch.device, budget: int | None) -> int | None:
    """The largest batch `plan` (observe/plan.py, as the builder asks it) fits in `budget`
    (else the device's memory): the first real trial. None where the model cannot be
    planned, or without a plan."""
    if plan is None:
        return None
    memory = budget or torch.cuda.get_device_properties(device).total_memory
    try:
        start = plan(memory)
    except ConfigError as error:
        log.info("batch_size=auto: no plan to start from (%s); doubling from %d", error, STEP)
        return None
    log.info("batch_size=auto: the plan fits %s samples; the search starts there", start)
    return start or None


def _find_cuda(finder, trainee, device, precision_dtype, memory_format, cap, bound, plan):
    budget = int(finder.max_memory_gib * GIB) if finder.max_memory_gib else None
    probe = _Probe(*trainee, device, precision_dtype, memory_format)

    def fits(n: int) -> bool:
        torch.cuda.reset_peak_memory_stats(device)
        try:
            probe.steps(n, count=2)  # the second step runs with the optimizer state in place
            torch.cuda.synchronize(device)
            ok = budget is None or torch.cuda.max_memory_allocated(device) <= budget
        except torch.OutOfMemoryError:
            ok = False
        probe.optimizers.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.empty_cache()
        log.debug("batch_size=auto: %d %s", n, "fits" if ok else "does not fit")
        return ok

    largest = largest_fitting(fits, cap, start=planned_start(plan, device, budget))
    probe = None  # frees the probe's model and optimizer state
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)  # the run's peak is the run's own
    if largest == 0:
        raise RuntimeError(
            f"batch_size=auto: not even {STEP} samples fit on {device}; "
            "try model.checkpointing=true, amp=on, or a smaller model"
        )
    if largest == cap:
        return BatchSizeChoice(cap, bound, budget)
    chosen = max(STEP, int(largest * (1 - finder.margin)) // STEP * STEP)
    return BatchSizeChoice(chosen, "memory_budget" if budget else "out_of_memory", budget)


class TensorMemory(TorchDispatchMode):
    """Bytes of the tensors that operators allocate inside this mode: now, and at the peak.

    Each new storage counts from the operator that creates it until it is freed (a weakref
    finalizer fires when the last tensor, view or autograd node holding it lets go); views
    and in-place results share their input's storage and add nothing. Forward and backward
    both run through the mode. Deterministic, unlike reading the process's heap.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}  # id(storage) -> bytes
        self.current = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {
            id(t.untyped_storage())
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor)
        }
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                if id(storage) not in inputs and id(storage) not in self.live:
                    self._track(storage)
        self.peak = max(self.peak, self.current)
        return out

    def _track(self, storage: torch.UntypedStorage) -> None:
        key = id(storage)
        self.live[key] = storage.nbytes()
        self.current += self.live[key]
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key)

    def restart_peak(self) -> None:
        self.peak = self.current


def available_memory() -> int:
    """Bytes of RAM available to new allocations now (Linux: MemAvailable)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _storage_bytes(tensors) -> int:
    storages = {id(t.untyped_storage()): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def _state_tensors(optimizers: Optimizers) -> list[torch.Tensor]:
    """The optimizers' state tensors (moments, momentum buffers), for memory accounting."""
    return [
        t
        for optimizer in optimizers.optimizers
        for state in optimizer.state.values()
        for t in state.values()
        if torch.is_tensor(t)
    ]


@dataclass
class MemoryModel:
    """Peak bytes of a training step at batch size n: held + max(fwd/bwd(n), step(n))."""

    held: float  # parameters, buffers and optimizer state, there before the step
    forward_backward: tuple[float, float]  # (fixed, per sample) of the forward/backward peak
    optimizer_step: tuple[float, float]  # (fixed, per sample) of the optimizer step's peak

    def peak(self, n: int) -> float:
        phases = (self.forward_backward, self.optimizer_step)
        return self.held + max(fixed + per_sample * n for fixed, per_sample in phases)


def measure_step_memory(probe: _Probe, n: int) -> tuple[float, float]:
    """(forward/backward peak, optimizer-step peak) in bytes beyond what the probe holds."""
    with TensorMemory() as memory:
        probe.forward_backward(n)
        forward_backward = memory.peak
        memory.restart_peak()
        probe.optimizer_step()
        return forward_backward, memory.peak


def measure_cpu_memory(
    model_cfg: DictConfig, optimizer_cfg: DictConfig, task: Task, precision_dtype,
    memory_format, sizes=(4, 8),
) -> MemoryModel:  # fmt: skip
    """The memory model of training on the CPU, from one real step at each of two sizes."""
    cpu = torch.device("cpu")
    probe = _Probe(model_cfg, optimizer_cfg, task, cpu, precision_dtype, memory_format)
    probe.steps(sizes[0], count=1)  # allocates the optimizer state
    state = _state_tensors(probe.optimizers)
    held = _storage_bytes([*probe.model.parameters(), *probe.model.buffers(), *state])
    (fb0, step0), (fb1, step1) = (measure_step_memory(probe, n) for n in sizes)

    def line(y0: float, y1: float) -> tuple[float, float]:
        per_sample = (y1 - y0) / (sizes[1] - sizes[0])
        return y0 - per_sample * sizes[0], per_sample

    return MemoryModel(held, line(fb0, fb1), line(step0, step1))


def tracked_step_peak(
    model_cfg: DictConfig, optimizer_cfg: DictConfig, batch_size: int, task: Task,
    precision_dtype, memory_format,
) -> int:  # fmt: skip
    """Peak tensor bytes of a real CPU training step at `batch_size`, the optimizer state
    in place: what plan.check holds the plan against (observe/plan.py PlanCheck)."""
    with torch.random.fork_rng(devices=[]):
        cpu = torch.device("cpu")
        probe = _Probe(model_cfg, optimizer_cfg, task, cpu, precision_dtype, memory_format)
        probe.steps(batch_size, count=1)  # allocates the optimizer state
        state = _state_tensors(probe.optimizers)
        held = _storage_bytes([*probe.model.parameters(), *probe.model.buffers(), *state])
        return int(held + max(measure_step_memory(probe, batch_size)))


def _find_cpu(finder, trainee, precision_dtype, memory_format, cap, bound) -> BatchSizeChoice:
    if finder.max_memory_gib:
        budget = int(finder.max_memory_gib * GIB)
    else:
        budget = int(finder.memory_fraction * available_memory())
    memory = measure_cpu_memory(*trainee, precision_dtype, memory_format)

    def fits(n: int) -> bool:
        return memory.peak(n) * (1 + finder.margin) <= budget

    chosen = largest_fitting(fits, cap)
    if chosen == 0:
        raise RuntimeError(
            f"batch_size=auto: {STEP} samples need about {memory.peak(STEP) / GIB:.2f} GiB, "
            f"over the budget of {budget / GIB:.2f} GiB (batch_size_finder.max_memory_gib)"
        )
    if chosen < cap:
        bound = "memory_budget"
    per_sample = max(memory.forward_backward[1], memory.optimizer_step[1])
    return BatchSizeChoice(chosen, bound, budget, per_sample, memory.peak(0))


def find_batch_size(
    finder: BatchSizeFinderConfig,
    model_cfg: DictConfig,
    optimizer_cfg: DictConfig,
    task: Task,
    device: torch.device,
    precision_dtype: torch.dtype | None,
    memory_format: torch.memory_format,
    num_samples: int | None = None,
    plan: Plan | None = None,
) -> BatchSizeChoice:
    """The size to train `model_cfg`'s model with `optimizer_cfg`'s optimizers on `task`,
    as the `batch_size_finder` node says; `num_samples` (the training set's size) caps it.
    `plan` (CUDA): where the search starts (None: doubling from 8)."""
    cap, bound = size_cap(finder, num_samples)
    trainee = (model_cfg, optimizer_cfg, task)
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):  # the run's seeds are not disturbed
        if device.type == "cuda":
            return _find_cuda(
                finder, trainee, device, precision_dtype, memory_format, cap, bound, plan
            )
        return _find_cpu(finder, trainee, precision_dtype, memory_format, cap, bound)


def agree_across_ranks(batch_size: int, device: torch.device) -> int:
    """The smallest rank's size, so that every rank runs the same number of steps."""
    _, (negated,) = gather_sum_max([], [-batch_size], device)
    return int(-negated)


def resolve_batch_size(
    finder: BatchSizeFinderConfig,
    model_cfg: DictConfig,
    optimizer_cfg: DictConfig,
    task: Task,
    device: torch.device,
    precision_dtype: torch.dtype | None,
    memory_format: torch.memory_format,
    num_samples: int | None,
    resumed: int | str | None = None,
    plan: Plan | None = None,
) -> BatchSizeChoice:
    """batch_size=auto's choice: the size found (find_batch_size), the smallest over the
    ranks.

    A resumed run keeps its checkpoint's size (`resumed`): its position in the epoch counts
    batches.
    """
    if isinstance(resumed, int):
        choice = BatchSizeChoice(resumed, "resumed_checkpoint")
    else:
        choice = find_batch_size(
            finder, model_cfg, optimizer_cfg, task, device, precision_dtype, memory_format,
            num_samples, plan,
        )  # fmt: skip
        agreed = agree_across_ranks(choice.batch_size, device)
        if agreed < choice.batch_size:
            choice = replace(choice, batch_size=agreed, bound="another_rank")
    log.info(
        "batch_size=auto: %d (bound: %s%s)",
        choice.batch_size,
        choice.bound,
        f", budget {choice.budget_bytes / GIB:.2f} GiB" if choice.budget_bytes else "",
    )
    return choice
