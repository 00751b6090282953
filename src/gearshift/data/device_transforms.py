"""Normalisation and simple augmentation on the training device (`device_transforms.*`).

Done after the copy, batch-wide, on the device: the host (or the loader's workers) only
decodes and copies, and the per-pixel arithmetic runs where the FLOPs are cheap. Random
draws come from a seeded generator on the device, so augmenting costs no host round trip
and a run is reproducible. Training batches are cropped and flipped; validation batches
are only normalised. Integer images (uint8) become floats in [0, 1] here, so the copy
moves one byte per pixel instead of four.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from omegaconf import DictConfig


class DeviceTransforms:
    def __init__(
        self,
        cfg: DictConfig,
        device: torch.device,
        memory_format: torch.memory_format,
        seed: int,
    ) -> None:
        self.normalize, self.hflip, self.padding = cfg.normalize, cfg.hflip, cfg.crop_padding
        self.mean = torch.tensor(list(cfg.mean), device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(list(cfg.std), device=device).view(1, -1, 1, 1)
        self.memory_format = memory_format
        self.generator = torch.Generator(device=device).manual_seed(seed)

    @staticmethod
    def describe(cfg: DictConfig) -> str:
        """The switched-on transforms, for the summary's gears: e.g. "normalize+hflip+crop4"."""
        parts = [
            *(["normalize"] if cfg.normalize else []),
            *(["hflip"] if cfg.hflip else []),
            *([f"crop{cfg.crop_padding}"] if cfg.crop_padding else []),
        ]
        return "+".join(parts) or "off"

    @property
    def active(self) -> bool:
        return bool(self.normalize or self.hflip or self.padding)

    def __call__(self, images: torch.Tensor, train: bool) -> torch.Tensor:
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            return images  # not a batch of images: nothing here applies
        if images.dtype == torch.uint8:
            images = images.float().div_(255)
        elif not self.active:
            return images
        if train and self.padding:
            images = self.random_crop(images)
        if train and self.hflip:
            images = self.random_hflip(images)
        if self.normalize:
            images = (images - self.mean) / self.std
        return images.contiguous(memory_format=self.memory_format)

    def random_crop(self, images: torch.Tensor) -> torch.Tensor:
        """Each sample: a random HxW window of the image zero-padded by `padding` on every side."""
        n, c, h, w = images.shape
        p, device = self.padding, images.device
        padded = F.pad(images, (p, p, p, p))
        top = torch.randint(0, 2 * p + 1, (n, 1), device=device, generator=self.generator)
        left = torch.randint(0, 2 * p + 1, (n, 1), device=device, generator=self.generator)
        rows = (top + torch.arange(h, device=device))[:, None, :, None]
        cols = (left + torch.arange(w, device=device))[:, None, None, :]
        samples = torch.arange(n, device=device)[:, None, None, None]
        channels = torch.arange(c, device=device)[None, :, None, None]
        return padded[samples, channels, rows, cols]

    def random_hflip(self, images: torch.Tensor) -> torch.Tensor:
        """Mirror a random half of the samples left to right."""
        flip = torch.rand(images.shape[0], device=images.device, generator=self.generator) < 0.5
        return torch.where(flip[:, None, None, None], images.flip(3), images)
