"""Device slots: what each of the trials side by side on one machine may use.

With the Optuna sweeper's `n_jobs` trials in flight through `hydra/launcher=processes`, the
machine is cut into `n_jobs` slots and each trial runs in one: on a machine with GPUs, one
GPU per trial (CUDA_VISIBLE_DEVICES); everywhere, a disjoint set of the cores this process
may use (the trial's process is pinned to them with os.sched_setaffinity, and torch's
threads match them), so two trials neither share a device nor oversubscribe the cores.
One slot (`n_jobs=1`, the ablation's sequential runs) is the whole machine, as without slots.
"""

import os
from collections.abc import Sequence
from dataclasses import dataclass


class SlotError(ValueError):
    """More trials at once than the machine has devices or cores for: says which."""


@dataclass(frozen=True)
class Slot:
    index: int
    cores: tuple[int, ...]  # the CPU cores the trial's process may run on
    gpus: tuple[str, ...] | None  # its CUDA_VISIBLE_DEVICES entries; None: no GPU here


def plan_slots(n: int, cores: Sequence[int], gpus: Sequence[str]) -> list[Slot]:
    """`n` slots over these cores and GPUs (CUDA_VISIBLE_DEVICES entries: indices or UUIDs):
    one GPU each where there are GPUs, the cores split into disjoint contiguous runs."""
    if n < 1:
        raise SlotError(f"hydra.sweeper.n_jobs={n} is not allowed; an integer >= 1")
    cores, gpus = sorted(cores), list(gpus)
    if n == 1:
        return [Slot(0, tuple(cores), tuple(gpus) if gpus else None)]
    if gpus and n > len(gpus):
        raise SlotError(
            f"hydra.sweeper.n_jobs={n} is not allowed with hydra/launcher=processes on "
            f"{len(gpus)} GPUs; at most {len(gpus)} (one GPU per trial)"
        )
    if n > len(cores):
        raise SlotError(
            f"hydra.sweeper.n_jobs={n} is not allowed with hydra/launcher=processes on "
            f"{len(cores)} cores; at most {len(cores)} (each trial gets cores of its own)"
        )
    size, extra = divmod(len(cores), n)
    slots, start = [], 0
    for index in range(n):
        end = start + size + (index < extra)
        slots.append(Slot(index, tuple(cores[start:end]), (gpus[index],) if gpus else None))
        start = end
    return slots


def usable_cores() -> list[int]:
    """The cores this process may run on (its affinity: a container's or a job's share)."""
    return sorted(os.sched_getaffinity(0))


def visible_gpus() -> list[str]:
    """The GPUs this process sees: CUDA_VISIBLE_DEVICES' entries when set, else torch's count."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [entry.strip() for entry in listed.split(",") if entry.strip()]
    import torch

    return [str(index) for index in range(torch.cuda.device_count())]


def slot_setup(slot: Slot) -> list[str]:
    """Shell lines that give a job started under them this slot's devices and thread count
    (OMP_NUM_THREADS: before any library starts its thread pool)."""
    lines = [f"export OMP_NUM_THREADS={len(slot.cores)}"]
    if slot.gpus is None:
        return lines
    return [*lines, f"export CUDA_VISIBLE_DEVICES={','.join(slot.gpus)}"]


def enter_slot(slot: Slot) -> None:
    """In the trial's own process, before it trains: run on the slot's cores only, with as
    many torch threads (the data loader's workers, forked later, inherit the affinity)."""
    import torch

    os.sched_setaffinity(0, slot.cores)
    torch.set_num_threads(len(slot.cores))
