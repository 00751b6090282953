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
from torch.utils.data import DataLoader, Dataset

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


class DeviceBatches:
    """Batches sliced from tensors that already live on the training device.

    Shuffling draws a permutation on the device from a seeded generator, so the order
    of samples is the same for every batch size (and costs no host round trip).
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        batch_size: int,
        shuffle: bool,
        drop_last: bool,
        seed: int,
    ) -> None:
        self.images, self.labels = images, labels
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.generator = torch.Generator(device=images.device).manual_seed(seed)

    def __len__(self) -> int:
        n, b = len(self.labels), self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def __iter__(self) -> Iterator[Batch]:
        n = len(self.labels)
        if self.shuffle:
            order = torch.randperm(n, generator=self.generator, device=self.images.device)
        else:
            order = torch.arange(n, device=self.images.device)
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            index = order[start : start + self.batch_size]
            yield self.images[index], self.labels[index]


def cpu_count() -> int:
    """CPUs this process may run on (the affinity mask, which SLURM and containers set)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_num_workers(choice: int | str) -> int:
    """Tip 2: "auto" is 4 workers per device; this process drives one, so 4, capped by CPUs."""
    return min(4, cpu_count()) if choice == "auto" else int(choice)


def resolve_pin_memory(choice: bool | str, device: torch.device) -> bool:
    """Tip 3: page-locked host batches copy to CUDA faster and can copy asynchronously."""
    return device.type == "cuda" if choice == "auto" else bool(choice)


def build_loader(
    dataset: Dataset, cfg: DictConfig, device: torch.device, train: bool, seed: int
) -> DataLoader:
    """A DataLoader with the `dataloader` group's gears applied."""
    dl = cfg.dataloader
    workers = resolve_num_workers(dl.num_workers)
    worker_options = {}
    if workers > 0:  # these two are errors for a loader without workers
        worker_options = {
            "persistent_workers": dl.persistent_workers,
            "prefetch_factor": dl.prefetch_factor,
        }
    return DataLoader(
        dataset,
        batch_size=cfg.batch_size,
        shuffle=train,
        drop_last=dl.drop_last and train,
        num_workers=workers,
        pin_memory=resolve_pin_memory(dl.pin_memory, device),
        generator=torch.Generator().manual_seed(seed),
        **worker_options,
    )


def build_data(cfg: DictConfig, device: torch.device) -> tuple[object, object | None]:
    """(train batches, validation batches or None), both iterables of (images, labels)."""
    data = cfg.data
    if data.name != "synthetic":
        return _disk_loaders(cfg, device)
    home = device if data.on_device else torch.device("cpu")
    train_set = make_synthetic(data, data.num_samples, cfg.seed, 0, home)
    val_set = make_synthetic(data, data.num_val_samples, cfg.seed, 1, home)
    if data.on_device:
        train = DeviceBatches(*train_set, cfg.batch_size, True, cfg.dataloader.drop_last, cfg.seed)
        val = DeviceBatches(*val_set, cfg.batch_size, False, False, cfg.seed)
    else:
        train = build_loader(TensorImages(*train_set), cfg, device, train=True, seed=cfg.seed)
        val = build_loader(TensorImages(*val_set), cfg, device, train=False, seed=cfg.seed)
    return train, (val if data.num_val_samples > 0 else None)


def _disk_loaders(cfg: DictConfig, device: torch.device) -> tuple[DataLoader, DataLoader | None]:
    train_set, val_set = build_datasets(cfg)  # staged to local disk first if asked (tip 1)
    train = build_loader(train_set, cfg, device, train=True, seed=cfg.seed)
    if len(train) == 0:  # drop_last with fewer images than one batch
        raise ConfigError(
            f"batch_size={cfg.batch_size} is not allowed; with dataloader.drop_last=true it "
            f"must be <= the {len(train_set)} training images"
        )
    val = build_loader(val_set, cfg, device, train=False, seed=cfg.seed) if val_set else None
    return train, val


def to_device(
    batch: Batch, device: torch.device, non_blocking: bool, memory_format: torch.memory_format
) -> Batch:
    """Tips 7 and 16: one copy to the device, asynchronous when asked, in the model's layout."""
    images, labels = batch
    images = images.to(device, non_blocking=non_blocking, memory_format=memory_format)
    return images, labels.to(device, non_blocking=non_blocking)
