"""`dataloader.prefetch_to_device`: copy batch N+1 while batch N computes (docs/gears.md tip 7).

On CUDA with host data, `CudaPrefetcher` issues each batch's host-to-device copy on a side
stream as soon as the loop has taken the previous batch, so the copy overlaps the compute
queued for that previous batch (with pinned memory the copy is truly asynchronous). Before
a batch is handed out, the compute stream waits for its copy (`wait_stream`), and its
tensors are marked as used by the compute stream (`record_stream`) so the caching allocator
does not hand their memory to the side stream while the compute still reads it.

Anywhere else (CPU, or data already generated on the device) there is nothing to overlap
and the batches pass through untouched.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch.utils._pytree import tree_leaves

from gearshift.config.schema import DataLoaderConfig
from gearshift.data.loading import Batch, to_device


def prefetch_active(dataloader: DataLoaderConfig, on_device: bool, device: torch.device) -> bool:
    """Whether the prefetcher acts: asked for, on CUDA, with batches that come from the host
    (`on_device`: data.on_device)."""
    return bool(dataloader.prefetch_to_device and device.type == "cuda" and not on_device)


def batch_tensors(batch: Batch) -> list[torch.Tensor]:
    """Every tensor of a batch at any depth: inputs and targets may be tensors or nested
    tuples, lists and dicts of them, as `to_device` copies them."""
    return [leaf for leaf in tree_leaves(batch) if isinstance(leaf, torch.Tensor)]


class CudaPrefetcher:
    """Iterates `batches`, yielding each already on `device`, copied one batch ahead."""

    def __init__(
        self, batches: Iterable[Batch], device: torch.device, memory_format: torch.memory_format
    ) -> None:
        self.batches, self.device, self.memory_format = batches, device, memory_format

    def __len__(self) -> int:
        return len(self.batches)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.batches.set_epoch(epoch, start)

    def _copy(self, batch: Batch | None, stream: torch.cuda.Stream) -> Batch | None:
        if batch is None:
            return None
        with torch.cuda.stream(stream):  # the copies queue on the side stream
            return to_device(batch, self.device, True, self.memory_format)

    def __iter__(self) -> Iterator[Batch]:
        side = torch.cuda.Stream(self.device)
        compute = torch.cuda.current_stream(self.device)
        source = iter(self.batches)
        ahead = self._copy(next(source, None), side)
        while ahead is not None:
            compute.wait_stream(side)  # the batch's copy is done before compute reads it
            for tensor in batch_tensors(ahead):
                tensor.record_stream(compute)  # its memory is in use on compute, too
            batch = ahead
            ahead = self._copy(next(source, None), side)  # overlaps the compute on `batch`
            yield batch
