"""The batches of any source's datasets (docs/gears.md, tips 4 and 7): a source made on the
device (`data.on_device=true`) as index slices of its tensors (no loader, no copies), any
other by a DataLoader (host_loader.py, loaded then); either way in loading_base.py's
`epoch_order`, so a resumed run continues exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig
from torch.utils._pytree import tree_map
from torch.utils.data import Dataset

from gearshift.config import ConfigError
from gearshift.config.schema import DataLoaderConfig
from gearshift.data.loading_base import Batch, LoaderSettings, batches_per_epoch, epoch_order
from gearshift.data.synthetic import TensorPairs


@dataclass(eq=False)
class DeviceBatches:
    """Batches sliced from tensors that already live on the training device (tip 4)."""

    inputs: torch.Tensor
    targets: torch.Tensor
    batch_size: int
    shuffle: bool
    drop_last: bool
    seed: int
    rank: int = 0
    world_size: int = 1
    epoch: int = 0  # what the next iteration yields (set_epoch)
    start: int = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """The next iteration yields `epoch`'s batches from the epoch's sample `start` on."""
        self.epoch, self.start = epoch, start

    def __len__(self) -> int:
        """This rank's batches left in the epoch (from `start`)."""
        return batches_per_epoch(
            len(self.targets) - self.start, self.world_size, self.batch_size, self.drop_last
        )

    def __iter__(self) -> Iterator[Batch]:
        order = epoch_order(
            len(self.targets), self.epoch, self.seed, self.shuffle, self.rank, self.world_size,
            device=self.inputs.device, start=self.start,
        )  # fmt: skip
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            index = order[start : start + self.batch_size]
            # index_select: on a CPU ~10x faster than advanced indexing (x[index]) for a batch
            yield self.inputs.index_select(0, index), self.targets.index_select(0, index)


def loader_settings(dl: DataLoaderConfig, device: torch.device, on_device: bool) -> LoaderSettings:
    """The `dataloader` node against this machine; data made on the device has no loader."""
    if on_device:
        return LoaderSettings(0, "data.on_device=true: no loader", False)
    from gearshift.data.host_loader import host_settings

    return host_settings(dl, device)


def build_batches(
    data: DictConfig,
    dataloader: DataLoaderConfig,
    train_set: Dataset,
    val_set: Dataset | None,
    device: torch.device,
    batch_size: int,
    seed: int,
    max_steps: int | None = None,
    memory_format: torch.memory_format = torch.contiguous_format,
    rank: int = 0,
    world_size: int = 1,
    settings: LoaderSettings | None = None,
) -> tuple[Any, Any | None]:
    """(train batches, validation batches or None) of this rank: iterables of
    (inputs, targets) with `set_epoch(epoch, start)` (the epoch's first sample to serve, over
    all ranks) and `len()` (this rank's batches from there to the epoch's end). `data`: the
    data node (`on_device`, `decode`); `max_steps` ends a stream of unknown length."""
    if data.get("on_device"):  # the source made its tensors on the device: slice them there
        drop_last = dataloader.drop_last
        shard = {"rank": rank, "world_size": world_size}
        train = DeviceBatches(*_tensors(train_set), batch_size, True, drop_last, seed, **shard)
        val = None
        if val_set is not None:
            val = DeviceBatches(*_tensors(val_set), batch_size, False, False, seed, **shard)
    else:  # served from the host by a DataLoader
        from gearshift.data.host_loader import host_batches

        train, val = host_batches(
            data, dataloader, train_set, val_set, device, batch_size, seed, max_steps,
            memory_format, rank, world_size, settings,
        )  # fmt: skip
    if len(train) == 0:  # drop_last with fewer samples than one batch
        raise ConfigError(
            f"batch_size={batch_size} is not allowed; with dataloader.drop_last=true it "
            f"must be <= the {len(train_set)} training samples"
        )
    return train, val


def _tensors(dataset: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(dataset, TensorPairs):
        raise ConfigError(
            f"data.on_device=True is not allowed; the source gave a {type(dataset).__name__}, "
            "and only tensors made on the device (TensorPairs) are served from there"
        )
    return dataset.inputs, dataset.targets


def to_device(
    batch: Batch, device: torch.device, non_blocking: bool, memory_format: torch.memory_format
) -> Batch:
    """Tips 7 and 16: one copy to the device, asynchronous when asked; images (4-D, floating
    or uint8) in the model's layout; leaves other than tensors (strings) stay as they are."""

    def move(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        if x.dim() == 4 and (x.is_floating_point() or x.dtype == torch.uint8):
            return x.to(device, non_blocking=non_blocking, memory_format=memory_format)
        return x.to(device, non_blocking=non_blocking)

    return tree_map(move, batch)  # a lone tensor is a leaf: move(batch)


def stream_position(batches: Any) -> Any | None:
    """The stream batches under any wrappers (the CUDA prefetcher), or None (map-style)."""
    while batches is not None and not hasattr(batches, "stream_state"):
        batches = getattr(batches, "batches", None)
    return batches
