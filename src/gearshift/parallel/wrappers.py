"""The model wrapped for `distributed=ddp`, `dp` or `fsdp` (docs/gears.md tip 18), and FSDP's
window without gradient sync: loaded by a run of one of them only (distributed.py
`wrap_model`, `grad_sync`)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from gearshift.config.schema import DistributedConfig

log = logging.getLogger(__name__)


def wrap(
    model: nn.Module,
    strategy: str,
    device: torch.device,
    cfg: DistributedConfig,
    blocks: Sequence[nn.Module],
) -> nn.Module:
    """DDP, DataParallel or FSDP around `model`; under FSDP each of `blocks` is a unit of its
    own, then the root."""
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


@contextmanager
def fsdp_no_sync(model: nn.Module) -> Iterator[None]:
    """FSDP2's counterpart of DDP's `no_sync`: no gradient reduce-scatter inside."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
