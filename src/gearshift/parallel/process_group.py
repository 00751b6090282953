"""The process group of a DDP or FSDP run (build.py `distributed_job`): nccl on CUDA, gloo
on CPU, under torchrun on a store private to this restart attempt; and rank 0's values told
to every rank. Loaded only where there are several ranks.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from gearshift.config.schema import DistributedConfig
from gearshift.parallel.distributed import Ranks


def init_process_group(ranks: Ranks, device: torch.device, cfg: DistributedConfig) -> None:
    backend = (
        cfg.backend if cfg.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    )
    timeout = timedelta(seconds=cfg.timeout_s)
    dist.init_process_group(
        backend,
        store=attempt_store(ranks, timeout),
        rank=ranks.rank,
        world_size=ranks.world_size,
        timeout=timeout,
        device_id=device if device.type == "cuda" else None,
    )


def attempt_store(ranks: Ranks, timeout: timedelta) -> dist.Store | None:
    """Under torchrun, a view of the agent's store private to this restart attempt.

    The agent keeps one store across restarts; without a fresh prefix, a restarted rank can
    read the address a dead rank of the previous attempt published and fail to connect.
    None elsewhere: init_process_group then reads MASTER_ADDR/MASTER_PORT itself.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        ranks.world_size,
        is_master=False,
        timeout=timeout,
    )
    return dist.PrefixStore(f"gearshift/attempt_{agree_on_attempt(store, ranks, timeout)}", store)


def agree_on_attempt(store: dist.Store, ranks: Ranks, timeout: timedelta) -> str:
    """A name for this attempt that every rank gets and no earlier attempt used.

    TORCHELASTIC_RESTART_COUNT is no such name: each node's agent counts its own restarts,
    and one that restarts because a rank on another node failed does not count it. Rank 0
    names the attempt; every other rank posts a fresh nonce under the name it read and waits
    for rank 0 to echo it. A name left by an earlier attempt is never echoed (its ranks are
    gone: agents stop them before they meet again), so the rank reads the name again.
    """
    if ranks.is_zero:
        name = uuid.uuid4().hex
        store.set("gearshift/attempt", name)
        for rank in range(1, ranks.world_size):
            store.set(f"gearshift/{name}/echo_{rank}", store.get(f"gearshift/{name}/nonce_{rank}"))
        return name
    nonce = uuid.uuid4().hex.encode()
    deadline = time.monotonic() + timeout.total_seconds()
    while time.monotonic() < deadline:
        name = store.get("gearshift/attempt").decode()
        store.set(f"gearshift/{name}/nonce_{ranks.rank}", nonce)
        echo = f"gearshift/{name}/echo_{ranks.rank}"
        try:
            store.wait([echo], timedelta(seconds=1))
        except dist.DistStoreError:  # rank 0 has not got to this rank yet, or is gone
            continue
        if store.get(echo) == nonce:
            return name
        time.sleep(0.1)  # an earlier attempt's echo: wait for this attempt's rank 0
    raise TimeoutError(f"rank {ranks.rank}: rank 0 did not start within {timeout}")


def rank_zero_value(value: Any) -> Any:
    """Rank 0's `value` on every rank (e.g. the run folder, which Hydra names per process)."""
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
