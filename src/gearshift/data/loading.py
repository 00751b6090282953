"""The loaders that feed any source's datasets (docs/gears.md: tip 2 workers,
tip 3 pinned memory, tip 4 tensors on the device, tip 6 from_numpy, tip 7 non-blocking copies).

Every source yields `(inputs, targets)` samples. On the host they are served by a
DataLoader with the `dataloader` group's gears; a source made on the device
(`data.on_device=true`) is served as index slices of its tensors (tip 4: no loader, no
copies). Either way the order is a function of (seed, epoch), each rank takes its own
share, and an epoch can start at any batch, so a resumed run continues exactly.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils._pytree import tree_map
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from gearshift.config import ConfigError
from gearshift.config.schema import DataLoaderConfig
from gearshift.data.sources import worker_seed
from gearshift.data.synthetic import TensorPairs

if TYPE_CHECKING:  # data.decode=gpu's: loaded by the runs that decode on the device
    from gearshift.data.gpu_decode import DeviceDecodedBatches

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


class DeviceBatches:
    """Batches sliced from tensors that already live on the training device (tip 4)."""

    def __init__(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        batch_size: int,
        shuffle: bool,
        drop_last: bool,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.inputs, self.targets = inputs, targets
        self.batch_size, self.shuffle, self.drop_last, self.seed = (
            batch_size,
            shuffle,
            drop_last,
            seed,
        )
        self.rank, self.world_size = rank, world_size
        self.epoch = self.start = 0

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
            len(self.targets),
            self.epoch,
            self.seed,
            self.shuffle,
            self.rank,
            self.world_size,
            device=self.inputs.device,
            start=self.start,
        )
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            index = order[start : start + self.batch_size]
            # index_select: on a CPU ~10x faster than advanced indexing (x[index]) for a batch
            yield self.inputs.index_select(0, index), self.targets.index_select(0, index)


class EpochSampler(Sampler[int]):
    """A DataLoader sampler over `epoch_order`, able to start mid-epoch."""

    def __init__(
        self, n: int, shuffle: bool, seed: int, rank: int = 0, world_size: int = 1
    ) -> None:
        self.n, self.shuffle, self.seed, self.rank, self.world_size = (
            n,
            shuffle,
            seed,
            rank,
            world_size,
        )
        self.epoch = self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """`epoch`'s samples from the epoch's sample `start` on (over all ranks)."""
        self.epoch, self.start = epoch, start

    def __len__(self) -> int:
        return -(-(self.n - self.start) // self.world_size)

    def __iter__(self) -> Iterator[int]:
        order = epoch_order(
            self.n,
            self.epoch,
            self.seed,
            self.shuffle,
            self.rank,
            self.world_size,
            start=self.start,
        )
        return iter(order.tolist())


class LoaderBatches:
    """A DataLoader over an EpochSampler, with DeviceBatches' set_epoch/len interface.

    The workers' random streams (torch, random, numpy: the DataLoader seeds all three from
    one base seed) come from the loader's own generator, reseeded for every epoch: a function
    of (seed, rank, epoch), not of what else drew from torch's global generator before.
    """

    def __init__(self, loader: DataLoader, seed: int = 0, rank: int = 0) -> None:
        self.loader, self.seed, self.rank = loader, seed, rank
        self.dataset = loader.dataset
        self.sampler: EpochSampler = loader.sampler
        self.batch_size = loader.batch_size

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """`epoch`'s batches from the epoch's sample `start` on (over all ranks)."""
        self.sampler.set_epoch(epoch, start)
        self.loader.generator.manual_seed(worker_seed(self.seed, self.rank, epoch))

    def __len__(self) -> int:
        """This rank's batches left in the epoch (from the sampler's start)."""
        sampler = self.sampler
        return batches_per_epoch(
            sampler.n - sampler.start, sampler.world_size, self.batch_size, self.loader.drop_last
        )

    def __iter__(self) -> Iterator[Batch]:
        return iter(self.loader)


def cpu_count() -> int:
    """CPUs this process may run on (the affinity mask, which SLURM and containers set)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def loader_workers(choice: int | str, device: torch.device) -> tuple[int, str]:
    """dataloader.num_workers -> (workers, why). Tip 2: "auto" is 4 per device (this process
    drives one), capped by the CPUs. Training on the CPU, the compute threads already keep
    the cores busy, and a worker on a busy core slows every step: only free cores get one."""
    if choice != "auto":
        return int(choice), f"dataloader.num_workers={choice}"
    cpus = cpu_count()
    if device.type != "cpu":
        return min(4, cpus), f"auto: 4 per device, capped by the {cpus} CPUs"
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # ranks sharing these CPUs
    threads = torch.get_num_threads() * ranks_here
    free = max(0, cpus - threads)
    return min(4, free), (
        f"auto: training on the CPU, {threads} compute thread(s) on {cpus} CPUs leave "
        f"{free} free for workers (at most 4)"
    )


def resolve_num_workers(choice: int | str, device: torch.device) -> int:
    return loader_workers(choice, device)[0]


def resolve_pin_memory(choice: bool | str, device: torch.device) -> bool:
    """Tip 3: page-locked host batches copy to CUDA faster and can copy asynchronously."""
    return device.type == "cuda" if choice == "auto" else bool(choice)


@dataclass(frozen=True)
class LoaderSettings:
    """The loader gears as resolved for this device, decided once per run."""

    num_workers: int
    num_workers_reason: str
    pin_memory: bool


def loader_settings(dl: DataLoaderConfig, device: torch.device, on_device: bool) -> LoaderSettings:
    """The `dataloader` node against this machine; data made on the device has no loader."""
    if on_device:
        return LoaderSettings(0, "data.on_device=true: no loader", False)
    workers, reason = loader_workers(dl.num_workers, device)
    return LoaderSettings(workers, reason, resolve_pin_memory(dl.pin_memory, device))


def build_loader(
    dataset: Dataset,
    dataloader: DataLoaderConfig,
    batch_size: int,
    device: torch.device,
    train: bool,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    settings: LoaderSettings | None = None,
    decode: str | None = "host",
    memory_format: torch.memory_format = torch.contiguous_format,
) -> LoaderBatches | DeviceDecodedBatches:
    """A DataLoader with the `dataloader` group's gears applied (`settings`: as resolved
    for the run; by default resolved here). `decode`: `data.decode` (gpu: JPEG bytes,
    decoded on the device into `memory_format`)."""
    dl = dataloader
    settings = settings or loader_settings(dl, device, on_device=False)
    workers = settings.num_workers
    worker_options = {}
    if workers > 0:  # these two are errors for a loader without workers
        worker_options = {
            "persistent_workers": dl.persistent_workers,
            "prefetch_factor": dl.prefetch_factor,
        }
    if isinstance(dataset, IterableDataset):  # a stream: data/streams.py deals it out
        options = {
            "num_workers": workers,
            "pin_memory": settings.pin_memory,
            "collate_fn": getattr(dataset, "collate", None),
            **worker_options,
        }
        from gearshift.data.streams import build_stream_batches

        drop_last = dl.drop_last
        return build_stream_batches(
            dataset, options, batch_size, train, seed, rank, world_size, drop_last
        )
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=EpochSampler(
            len(dataset), train, seed, rank, world_size
        ),  # shards like DistributedSampler
        drop_last=dl.drop_last and train,
        num_workers=workers,
        pin_memory=settings.pin_memory,
        collate_fn=getattr(dataset, "collate", None),  # a dataset's own batching, if it has one
        generator=torch.Generator().manual_seed(worker_seed(seed, rank, 0)),
        **worker_options,
    )
    batches = LoaderBatches(loader, seed, rank)
    if decode != "gpu":
        return batches
    # data.decode=gpu: the loader yields JPEG bytes, decoded here on the device
    from gearshift.data.gpu_decode import decoded_on_device

    return decoded_on_device(batches, dataset, device, memory_format, dl.non_blocking)


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
    shard = {"rank": rank, "world_size": world_size}
    if data.get("on_device"):  # the source made its tensors on the device: slice them there
        drop_last = dataloader.drop_last
        train = DeviceBatches(*_tensors(train_set), batch_size, True, drop_last, seed, **shard)
        val = None
        if val_set is not None:
            val = DeviceBatches(*_tensors(val_set), batch_size, False, False, seed, **shard)
    else:
        if isinstance(train_set, IterableDataset):
            from gearshift.data.streams import check_length

            check_length(train_set, max_steps)  # unknown length: max_steps ends the run
        serve = {
            "settings": settings,
            "decode": OmegaConf.select(data, "decode"),
            "memory_format": memory_format,
            **shard,
        }
        train = build_loader(train_set, dataloader, batch_size, device, True, seed, **serve)
        val = None
        if val_set is not None:
            val = build_loader(val_set, dataloader, batch_size, device, False, seed, **serve)
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
    or uint8) in the model's layout. A batch may be a pair, a dict of fields or any nesting
    of tuples, lists and dicts of tensors (other leaves, e.g. a batch's strings, stay as
    they are)."""

    def move(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        if x.dim() == 4 and (x.is_floating_point() or x.dtype == torch.uint8):
            return x.to(device, non_blocking=non_blocking, memory_format=memory_format)
        return x.to(device, non_blocking=non_blocking)

    return _map(move, batch)


def _map(fn, x: Any) -> Any:
    return fn(x) if isinstance(x, torch.Tensor) else tree_map(fn, x)  # the common case first


def stream_position(batches: Any) -> Any | None:
    """The stream batches under any wrappers (the CUDA prefetcher), or None (map-style)."""
    while batches is not None and not hasattr(batches, "stream_state"):
        batches = getattr(batches, "batches", None)
    return batches
