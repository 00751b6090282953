"""The host's DataLoader path (docs/gears.md: tip 2 workers, tip 3 pinned memory): a
source's map-style datasets served by a DataLoader over an `EpochSampler`, with the
`dataloader` group's gears resolved for this machine.

Loaded by the sources served from the host (`data.on_device=false`: the disk sources, yours),
by the advisor's loader rule on CUDA and by local_ranks.py (`cpu_count`); data made on the
device (loading.py `DeviceBatches`) needs none of it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from gearshift.config.schema import DataLoaderConfig
from gearshift.data.loading_base import Batch, LoaderSettings, batches_per_epoch, epoch_order
from gearshift.data.sources import worker_seed

if TYPE_CHECKING:  # data.decode=gpu's: loaded by the runs that decode on the device
    from gearshift.data.gpu_decode import DeviceDecodedBatches


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


def host_settings(dl: DataLoaderConfig, device: torch.device) -> LoaderSettings:
    """The `dataloader` node against this machine."""
    workers, reason = loader_workers(dl.num_workers, device)
    return LoaderSettings(workers, reason, resolve_pin_memory(dl.pin_memory, device))


def host_batches(
    data: DictConfig,
    dataloader: DataLoaderConfig,
    train_set: Dataset,
    val_set: Dataset | None,
    device: torch.device,
    batch_size: int,
    seed: int,
    max_steps: int | None,
    memory_format: torch.memory_format,
    rank: int,
    world_size: int,
    settings: LoaderSettings | None,
) -> tuple[Any, Any | None]:
    """loading.py `build_batches` for a source served from the host: (a loader of the
    training set, one of the validation set or None)."""
    if isinstance(train_set, IterableDataset):
        from gearshift.data.streams import check_length

        check_length(train_set, max_steps)  # unknown length: max_steps ends the run
    serve = {
        "settings": settings,
        "decode": OmegaConf.select(data, "decode"),
        "memory_format": memory_format,
        "rank": rank,
        "world_size": world_size,
    }
    train = build_loader(train_set, dataloader, batch_size, device, True, seed, **serve)
    val = None
    if val_set is not None:
        val = build_loader(val_set, dataloader, batch_size, device, False, seed, **serve)
    return train, val


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
    settings = settings or host_settings(dl, device)
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
