"""Datasets and the loaders that feed them (tips 1, 2, 3, 4, 6, 7).

`data=synthetic` draws images around one random pattern per class, so a model can learn
it. With `data.on_device=true` (the default) the whole set is generated on the training
device and batches are index slices there (tip 4: no loader, no copies). With
`data.on_device=false` it is an ordinary map-style dataset on the host, served by a
DataLoader like real data, so the data-loader gears have something to act on.
`data=imagefolder` and `data=cifar10` (datasets.py) are served by the same DataLoader.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Dataset, Sampler

from gearshift.config import ConfigError
from gearshift.datasets import build_datasets

Batch = tuple[torch.Tensor, torch.Tensor]


def make_synthetic(
    cfg: DictConfig, num_samples: int, seed: int, split: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Images = their class's smooth random pattern + Gaussian noise; labels uniform.

    The patterns depend on `seed` alone and the samples on `seed` and `split`, so the
    train (split 0) and validation (split 1) sets share their classes, not their samples.
    """
    shape = (cfg.channels, cfg.image_size, cfg.image_size)
    g = torch.Generator(device=device).manual_seed(seed)
    coarse = torch.randn(cfg.num_classes, cfg.channels, 4, 4, generator=g, device=device)
    patterns = F.interpolate(coarse, size=shape[1:], mode="bilinear", align_corners=False)
    g.manual_seed(seed * 7919 + split + 1)
    labels = torch.randint(cfg.num_classes, (num_samples,), generator=g, device=device)
    noise = torch.randn((num_samples, *shape), generator=g, device=device)
    return patterns[labels] + cfg.noise * noise, labels


class TensorImages(Dataset):
    """A map-style dataset over host tensors: one sample per __getitem__, like real data."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> Batch:
        return self.images[index], self.labels[index]


def epoch_order(
    n: int, epoch: int, seed: int, shuffle: bool, rank: int, world_size: int, device=None
) -> torch.Tensor:
    """The sample indices this rank visits in `epoch`.

    The permutation depends on (seed, epoch) alone, so any position in any epoch can be
    recomputed when a run resumes, and every batch size sees the samples in the same
    order. Ranks take interleaved shares of equal length (the order wraps around to pad
    the last ones, like DistributedSampler).
    """
    if shuffle:
        generator = torch.Generator(device=device).manual_seed(seed + epoch)
        order = torch.randperm(n, generator=generator, device=device)
    else:
        order = torch.arange(n, device=device)
    per_rank = -(-n // world_size)
    if per_rank * world_size > n:
        order = torch.cat([order, order[: per_rank * world_size - n]])
    return order[rank::world_size]


def batches_per_epoch(n: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    per_rank = -(-n // world_size)
    return per_rank // batch_size if drop_last else -(-per_rank // batch_size)


class DeviceBatches:
    """Batches sliced from tensors that already live on the training device (tip 4)."""

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        batch_size: int,
        shuffle: bool,
        drop_last: bool,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.images, self.labels = images, labels
        self.batch_size, self.shuffle, self.drop_last, self.seed = (
            batch_size,
            shuffle,
            drop_last,
            seed,
        )
        self.rank, self.world_size = rank, world_size
        self.epoch = self.start_batch = 0

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """The next iteration yields `epoch`'s batches from `start_batch` on."""
        self.epoch, self.start_batch = epoch, start_batch

    def __len__(self) -> int:
        return batches_per_epoch(len(self.labels), self.world_size, self.batch_size, self.drop_last)

    def __iter__(self) -> Iterator[Batch]:
        order = epoch_order(
            len(self.labels),
            self.epoch,
            self.seed,
            self.shuffle,
            self.rank,
            self.world_size,
            device=self.images.device,
        )
        for start in range(
            self.start_batch * self.batch_size, len(self) * self.batch_size, self.batch_size
        ):
            index = order[start : start + self.batch_size]
            yield self.images[index], self.labels[index]


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
        self.epoch, self.start = epoch, start

    def __len__(self) -> int:
        return -(-self.n // self.world_size) - self.start

    def __iter__(self) -> Iterator[int]:
        order = epoch_order(self.n, self.epoch, self.seed, self.shuffle, self.rank, self.world_size)
        return iter(order[self.start :].tolist())


class LoaderBatches:
    """A DataLoader over an EpochSampler, with DeviceBatches' set_epoch/len interface."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader
        self.dataset = loader.dataset
        self.sampler: EpochSampler = loader.sampler
        self.batch_size = loader.batch_size
        sampler = self.sampler
        self.length = batches_per_epoch(
            sampler.n, sampler.world_size, self.batch_size, loader.drop_last
        )

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.sampler.set_epoch(epoch, start_batch * self.batch_size)

    def __len__(self) -> int:
        return self.length

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


def build_loader(
    dataset: Dataset,
    cfg: DictConfig,
    device: torch.device,
    train: bool,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
) -> LoaderBatches:
    """A DataLoader with the `dataloader` group's gears applied."""
    dl = cfg.dataloader
    workers = resolve_num_workers(dl.num_workers, device)
    worker_options = {}
    if workers > 0:  # these two are errors for a loader without workers
        worker_options = {
            "persistent_workers": dl.persistent_workers,
            "prefetch_factor": dl.prefetch_factor,
        }
    loader = DataLoader(
        dataset,
        batch_size=cfg.batch_size,
        sampler=EpochSampler(
            len(dataset), train, seed, rank, world_size
        ),  # shards like DistributedSampler
        drop_last=dl.drop_last and train,
        num_workers=workers,
        pin_memory=resolve_pin_memory(dl.pin_memory, device),
        **worker_options,
    )
    return LoaderBatches(loader)


def build_data(
    cfg: DictConfig, device: torch.device, rank: int = 0, world_size: int = 1
) -> tuple[object, object | None]:
    """(train batches, validation batches or None) of this rank: iterables of (images, labels)
    with `set_epoch(epoch, start_batch)` and `len()` (batches per epoch)."""
    data = cfg.data
    shard = {"rank": rank, "world_size": world_size}
    if data.name != "synthetic":
        return _disk_loaders(cfg, device, shard)
    home = device if data.on_device else torch.device("cpu")
    train_set = make_synthetic(data, data.num_samples, cfg.seed, 0, home)
    val_set = make_synthetic(data, data.num_val_samples, cfg.seed, 1, home)
    drop_last = cfg.dataloader.drop_last
    if data.on_device:
        train = DeviceBatches(*train_set, cfg.batch_size, True, drop_last, cfg.seed, **shard)
        val = DeviceBatches(*val_set, cfg.batch_size, False, False, cfg.seed, **shard)
    else:
        train = build_loader(TensorImages(*train_set), cfg, device, True, cfg.seed, **shard)
        val = build_loader(TensorImages(*val_set), cfg, device, False, cfg.seed, **shard)
    return train, (val if data.num_val_samples > 0 else None)


def _disk_loaders(
    cfg: DictConfig, device: torch.device, shard: dict[str, int]
) -> tuple[LoaderBatches, LoaderBatches | None]:
    train_set, val_set = build_datasets(cfg)  # staged to local disk first if asked (tip 1)
    train = build_loader(train_set, cfg, device, True, cfg.seed, **shard)
    if len(train) == 0:  # drop_last with fewer images than one batch
        raise ConfigError(
            f"batch_size={cfg.batch_size} is not allowed; with dataloader.drop_last=true it "
            f"must be <= the {len(train_set)} training images"
        )
    val = build_loader(val_set, cfg, device, False, cfg.seed, **shard) if val_set else None
    return train, val


def to_device(
    batch: Batch, device: torch.device, non_blocking: bool, memory_format: torch.memory_format
) -> Batch:
    """Tips 7 and 16: one copy to the device, asynchronous when asked, in the model's layout."""
    images, labels = batch
    images = images.to(device, non_blocking=non_blocking, memory_format=memory_format)
    return images, labels.to(device, non_blocking=non_blocking)
