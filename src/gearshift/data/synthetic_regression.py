"""`data=synthetic_regression`, the data of `task=regression`: images whose targets are a
fixed random linear function of their channel means, made where they are used as
synthetic.py's images are. Loaded by a run of this source only."""

from __future__ import annotations

import torch

from gearshift.data.synthetic import TensorPairs, _pairs_or_none, _split_generator


def synthetic_regression(
    num_samples: int = 4096,
    num_val_samples: int = 512,
    image_size: int = 8,
    channels: int = 3,
    num_outputs: int = 4,
    noise: float = 0.1,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> tuple[TensorPairs, TensorPairs | None]:
    """Gaussian images; targets = (channel means) @ a fixed random matrix + a little noise."""
    g = torch.Generator(device=device).manual_seed(seed)
    weights = torch.randn(channels, num_outputs, generator=g, device=device) * image_size

    def split(n: int, index: int) -> TensorPairs:
        g = _split_generator(seed, index, torch.device(device))
        images = torch.randn((n, channels, image_size, image_size), generator=g, device=device)
        targets = images.mean(dim=(2, 3)) @ weights
        targets += noise * torch.randn(targets.shape, generator=g, device=device)
        return TensorPairs(images, targets)

    return split(num_samples, 0), _pairs_or_none(split(num_val_samples, 1))
