"""Distributed gears (docs/gears.md tip 18): DDP done right, DataParallel and FSDP to compare.

Where the ranks come from: torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR/PORT), else SLURM's (one task per device), else `distributed.nproc_per_node`
starts them here through torch's elastic launcher (`launch_local`). The process group
(process_group.py, loaded with several ranks only) is nccl on CUDA and gloo on CPU; a
collective that waits longer than `distributed.timeout_s` for a dead rank fails instead
of hanging.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from gearshift.config.schema import DistributedConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_zero(self) -> bool:
        return self.rank == 0


def adopt_slurm_environment() -> None:
    """Under `srun` with several tasks and no torchrun, SLURM's variables name the ranks."""
    if "RANK" in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) < 2:
        return
    from gearshift.parallel.slurm_env import slurm_master_address

    os.environ.update(
        RANK=os.environ["SLURM_PROCID"],
        WORLD_SIZE=os.environ["SLURM_NTASKS"],
        LOCAL_RANK=os.environ.get("SLURM_LOCALID", "0"),
        MASTER_ADDR=os.environ.get("MASTER_ADDR")
        or slurm_master_address(os.environ.get("SLURM_JOB_NODELIST", "localhost")),
        MASTER_PORT=os.environ.get("MASTER_PORT")
        or str(20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000),
    )


def ranks_from_environment() -> Ranks:
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


def rank_zero_value(value: Any) -> Any:
    """Rank 0's `value` on every rank (e.g. the run folder, which Hydra names per process)."""
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


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
    if strategy == "ddp":
        if cfg.sync_batchnorm:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        return nn.parallel.DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=cfg.bucket_cap_mb,
            gradient_as_bucket_view=cfg.gradient_as_bucket_view,
            static_graph=cfg.static_graph,
        )
    if strategy == "dp":  # one process driving every local GPU: kept to measure against DDP
        return nn.DataParallel(model)
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        # One unit per block: its parameters are gathered just before it runs (forward and
        # backward) and freed after, so the whole model is never gathered at once; the root
        # unit keeps the rest (embeddings, head). Shards parameters, gradients and optimizer
        # state in place. Checkpointing comes first (build_model): a checkpointed block
        # recomputes in backward inside the window its unit's pre-backward hook gathered
        # (FSDP2 skips its forward hooks there), so the recomputation gathers nothing again.
        for block in blocks:
            fully_shard(block)
        log.info("fsdp: %d blocks sharded one by one, then the root", len(blocks))
        return fully_shard(model)
    return model


def grad_sync(model: nn.Module, enabled: bool) -> AbstractContextManager:
    """Skip the gradient all-reduce on accumulation micro-steps (all but a window's last)."""
    if enabled:
        return nullcontext()
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        return _fsdp_no_sync(model)
    return nullcontext()


class _fsdp_no_sync(AbstractContextManager):
    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __enter__(self):
        self.model.set_requires_gradient_sync(False)

    def __exit__(self, *exc):
        self.model.set_requires_gradient_sync(True)


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
