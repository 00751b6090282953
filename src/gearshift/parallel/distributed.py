"""Distributed gears (docs/gears.md tip 18): DDP done right, DataParallel and FSDP to compare.
Where the ranks come from, and their backend: docs/distributed.md. The process group
(process_group.py) and the wraps (wrappers.py) load with several ranks only.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from gearshift.config.schema import DistributedConfig


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_zero(self) -> bool:
        return self.rank == 0


def ranks_from_environment() -> Ranks:
    if "RANK" not in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        from gearshift.parallel.slurm_env import adopt_slurm_environment  # srun, no torchrun

        adopt_slurm_environment()
    return Ranks(
        rank=int(os.environ.get("RANK", "0")),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
    )


def resolve_strategy(choice: str, ranks: Ranks) -> str:
    """distributed=auto: DDP whenever this process is one of several ranks, else none."""
    if choice == "auto":
        return "ddp" if ranks.world_size > 1 else "none"
    return choice


def destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def wrap_model(
    model: nn.Module,
    strategy: str,
    device: torch.device,
    cfg: DistributedConfig,
    blocks: Sequence[nn.Module] = (),
) -> nn.Module:
    """The module the loop trains through; `model` itself stays the plain, unwrapped one.
    Under FSDP each of `blocks` (models/blocks.py) is a unit of its own, then the root."""
    if strategy == "none":
        return model
    from gearshift.parallel.wrappers import wrap  # distributed=ddp, dp or fsdp only

    return wrap(model, strategy, device, cfg, blocks)


def grad_sync(model: nn.Module, enabled: bool) -> AbstractContextManager:
    """Skip the gradient all-reduce on accumulation micro-steps (all but a window's last)."""
    if enabled:
        return nullcontext()
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        from gearshift.parallel.wrappers import fsdp_no_sync

        return fsdp_no_sync(model)
    return nullcontext()


def gather_sum_max(values: list[float], maxima: list[float], device: torch.device) -> tuple:
    """(sums of `values`, maxima of `maxima`) over all ranks: one collective, call at log steps."""
    if not dist.is_initialized():
        return values, maxima
    local = torch.tensor([*values, *maxima], dtype=torch.float64, device=device)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    table = torch.stack(gathered).cpu()
    n = len(values)
    return table[:, :n].sum(0).tolist(), table[:, n:].max(0).values.tolist()
