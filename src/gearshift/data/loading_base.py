"""What loading.py (slices of tensors on the device) and host_loader.py (a DataLoader on the
host) share: the order of an epoch's samples, the batches it makes, the loader gears.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

Batch = Any  # as a source's samples collate: a pair, a dict of fields, any nesting


def epoch_order(
    n: int,
    epoch: int,
    seed: int,
    shuffle: bool,
    rank: int,
    world_size: int,
    device=None,
    start: int = 0,
) -> torch.Tensor:
    """The sample indices this rank visits in `epoch`, from the epoch's sample `start` on.

    The permutation depends on (seed, epoch) alone, so any position in any epoch can be
    recomputed when a run resumes, and every batch size sees the samples in the same
    order. The samples from `start` on are dealt to the ranks in turn (interleaved shares
    of equal length; the order wraps around to pad the last ones, like
    DistributedSampler), so a run that resumes at `start` on any number of ranks, with any
    batch size, trains each of the epoch's remaining samples once (state/position.py).
    """
    if shuffle:
        generator = torch.Generator(device=device).manual_seed(seed + epoch)
        order = torch.randperm(n, generator=generator, device=device)
    else:
        order = torch.arange(n, device=device)
    rest = order[start:]
    padding = -(-len(rest) // world_size) * world_size - len(rest)
    if padding:
        rest = torch.cat([rest, order[:padding]])
    return rest[rank::world_size]


def batches_per_epoch(n: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    per_rank = -(-n // world_size)
    return per_rank // batch_size if drop_last else -(-per_rank // batch_size)


@dataclass(frozen=True)
class LoaderSettings:
    """The loader gears as resolved for this device, decided once per run."""

    num_workers: int
    num_workers_reason: str
    pin_memory: bool
