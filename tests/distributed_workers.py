"""Ranks for the distributed tests, started by tests/helpers.py `start_ranks` (forked)."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
import torch
from helpers import make_cfg, record_logs, recording_epoch_samples
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.optim.optimizer import register_optimizer_step_post_hook

import gearshift.build
import train
from gearshift.parallel.distributed import wrap_model


def become_rank(rank: int, world_size: int, port: int) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)


def count_allreduces(rank: int, world_size: int, port: int, out: str, overrides: list[str]) -> None:
    """Train with a DDP communication hook that counts gradient all-reduces; save what we saw."""
    become_rank(rank, world_size, port)
    calls = []

    def counting_wrap(*args, **kwargs):
        model = wrap_model(*args, **kwargs)

        def hook(state, bucket):
            calls.append(bucket.index())
            return allreduce_hook(state, bucket)

        model.register_comm_hook(None, hook)
        return model

    gearshift.build.wrap_model = counting_wrap
    result = fit_quietly(make_cfg(*overrides), Path(out) / f"rank{rank}")
    buckets = len(set(calls))
    torch.save(
        {
            "allreduces": len(calls),
            "buckets": buckets,
            "steps": result.summary["steps"],
            "summary": result.summary,
            "params": {k: v.detach().clone() for k, v in result.model.state_dict().items()},
        },
        Path(out) / f"rank{rank}.pt",
    )
    del result
    free_before_teardown()


def free_before_teardown() -> None:
    """Free what training left (the model, optimizer and the reference cycles that hold
    them) here, not in the interpreter's teardown: there, after the process group is gone,
    gloo aborted now and then ("terminate called without an active exception", SIGABRT)."""
    gc.collect()


def train_sharded(rank: int, world_size: int, port: int, out: str, overrides: list[str]) -> None:
    """Train under FSDP; save the shard of the parameters this rank ends with."""
    become_rank(rank, world_size, port)
    steps = []
    register_optimizer_step_post_hook(lambda *args: steps.append(1))
    result = fit_quietly(make_cfg("distributed=fsdp", *overrides), Path(out) / f"rank{rank}")
    # The process group is gone after fit; every rank holds its own shard: save the shards.
    shards = {k: v.to_local().clone() for k, v in result.model.state_dict().items()}
    torch.save(
        {"shards": shards, "summary": result.summary, "optimizer_steps": len(steps)},
        Path(out) / f"rank{rank}.pt",
    )
    del result
    free_before_teardown()  # torch.distributed.checkpoint touched these: more so here


def train_recorded(rank: int, world_size: int, port: int, out: str, overrides: list[str]) -> None:
    """Train as `overrides` say (composed without helpers.TINY: token data has no images);
    save this rank's parameters (under FSDP its shards), what it logged and FSDP's units."""
    become_rank(rank, world_size, port)
    logged = record_logs(pytest.MonkeyPatch())  # a spawned process: undone when it ends
    result = fit_quietly(make_cfg(*overrides, tiny=False), Path(out) / f"rank{rank}")
    params = {
        name: (value.to_local() if isinstance(value, DTensor) else value).detach().clone()
        for name, value in result.model.state_dict().items()
    }
    units = [name for name, m in result.model.named_modules() if isinstance(m, FSDPModule)]
    torch.save(
        {"params": params, "logged": logged, "units": units, "summary": result.summary},
        Path(out) / f"rank{rank}.pt",
    )
    del result
    free_before_teardown()


def fit_quietly(cfg, run_dir: Path):
    run_dir.mkdir(parents=True, exist_ok=True)
    return train.fit(cfg, run_dir)


def restored_state(rank: int, world_size: int, port: int, out: str, overrides: list[str]) -> None:
    """Build a run that resumes (`resume=PATH` among `overrides`) on this layout, as a
    training start does; rank 0 saves the whole model and optimizer state it restored,
    gathered from every rank, and the data position."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    from gearshift.parallel.distributed import ranks_from_environment, resolve_strategy
    from gearshift.parallel.process_group import init_process_group

    become_rank(rank, world_size, port)
    cfg = make_cfg(*overrides)
    ranks = ranks_from_environment()
    strategy = resolve_strategy(cfg.distributed.strategy, ranks)
    device = torch.device("cpu")
    if world_size > 1:
        init_process_group(ranks, device, cfg.distributed)
    Path(out).mkdir(parents=True, exist_ok=True)
    run = gearshift.build.build_run(cfg, Path(out) / "restored_run", ranks, strategy, device)
    whole = StateDictOptions(full_state_dict=True, cpu_offload=True)
    options = whole if dist.is_initialized() else StateDictOptions()
    model = get_model_state_dict(run.model, options=options)
    optimizer = get_optimizer_state_dict(run.model, run.optimizers.optimizers, options=options)
    if rank == 0:
        torch.save(
            {
                "model": model,
                "optimizer": optimizer,
                "position": run.position.state_dict(),
                "strategy": strategy,
            },
            Path(out) / "restored.pt",
        )
    del run
    free_before_teardown()
    if dist.is_initialized():
        dist.destroy_process_group()


def train_recording_samples(
    rank: int, world_size: int, port: int, out: str, overrides: list[str]
) -> None:
    """Train as `overrides` say; save the ids of the training samples of epoch 0 this rank
    took (through the DataLoader's sampler)."""
    become_rank(rank, world_size, port)
    with recording_epoch_samples() as taken:
        result = fit_quietly(make_cfg(*overrides), Path(out) / f"rank{rank}")
    torch.save({"taken": taken, "summary": result.summary}, Path(out) / f"rank{rank}.pt")
    del result
    free_before_teardown()
