"""Built-in sources that need no files: learnable synthetic data (`data=synthetic`), made on
the device with `data.on_device=true` (docs/gears.md tip 4), else a map-style dataset a
DataLoader serves like real data."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset


class TensorPairs(Dataset):
    """(inputs[i], targets[i]) over two tensors; on the device it is served as slices."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.inputs, self.targets = inputs, targets

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.targets[index]


def _split_generator(seed: int, split: int, device: torch.device) -> torch.Generator:
    """Train (split 0) and validation (split 1) draw different samples from one seed."""
    return torch.Generator(device=device).manual_seed(seed * 7919 + split + 1)


def _pairs_or_none(pairs: TensorPairs) -> TensorPairs | None:
    return pairs if len(pairs) else None


def synthetic_images(
    num_samples: int = 4096,
    num_val_samples: int = 512,
    image_size: int = 32,
    channels: int = 3,
    num_classes: int = 10,
    noise: float = 1.0,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> tuple[TensorPairs, TensorPairs | None]:
    """Images = their class's smooth random pattern + Gaussian noise; labels uniform. The
    patterns depend on `seed` alone, so train and validation share their classes, not their
    samples."""
    shape = (channels, image_size, image_size)
    g = torch.Generator(device=device).manual_seed(seed)
    coarse = torch.randn(num_classes, channels, 4, 4, generator=g, device=device)
    patterns = F.interpolate(coarse, size=shape[1:], mode="bilinear", align_corners=False)

    def split(n: int, index: int) -> TensorPairs:
        g = _split_generator(seed, index, torch.device(device))
        labels = torch.randint(num_classes, (n,), generator=g, device=device)
        images = patterns[labels] + noise * torch.randn((n, *shape), generator=g, device=device)
        return TensorPairs(images, labels)

    return split(num_samples, 0), _pairs_or_none(split(num_val_samples, 1))
