"""Normalisation and simple augmentation on the training device (`device_transforms.*`).

Done after the copy, batch-wide, on the device: the host (or the loader's workers) only
decodes and copies, and the per-pixel arithmetic runs where the FLOPs are cheap. Training
batches are cropped and flipped; validation batches are only normalised. Integer images
(uint8) become floats in [0, 1] here, so the copy moves one byte per pixel instead of four.

Two stages, in this order: the data source's own (a disk source serving uint8 batches,
`data.batch_dtype=uint8`, hands its `data.augment`, `data.mean` and `data.std` over to the
device, as `source_transforms`), then the `device_transforms` group's. The random draws of
the n-th training batch come from a device generator seeded by (seed, n): no host round
trip, and a run resumed at batch n draws what the uninterrupted run drew (`start_at`).

Loaded when the group or the source switches a transform on (transforms_off.py
`build_transforms`), or when images arrive as bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten, tree_unflatten

from gearshift.config.schema import DeviceTransformsConfig

_BATCH_SEED_STRIDE = 1_000_003  # a prime: (seed, batch) pairs map to distinct seeds


class Stage:
    """One set of transforms: normalize, hflip, crop_padding (the group's field names)."""

    def __init__(self, fields: Any, device: torch.device) -> None:
        self.normalize, self.hflip = fields.normalize, fields.hflip
        self.padding = fields.crop_padding
        self.mean = torch.tensor(list(fields.mean), device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(list(fields.std), device=device).view(1, -1, 1, 1)
        self.byte_scale, self.byte_shift = 1 / (255 * self.std), self.mean / self.std

    @property
    def active(self) -> bool:
        return bool(self.normalize or self.hflip or self.padding)

    @staticmethod
    def identity(device: torch.device) -> Stage:
        return Stage(_Fields({}), device)

    def __call__(self, images: torch.Tensor, train: bool, generator: torch.Generator):
        images = self.augment(images, train, generator)
        if self.normalize:
            images = (images - self.mean) / self.std
        return images

    def augment(self, images: torch.Tensor, train: bool, generator: torch.Generator):
        if train and self.padding:
            images = random_crop(images, self.padding, generator)
        if train and self.hflip:
            images = random_hflip(images, generator)
        return images

    def to_float(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 -> float32 in [0, 1], normalised: one new tensor, changed in place (a fresh
        tensor per step costs more than the arithmetic on a CPU)."""
        images = images.float()
        if not self.normalize:
            return images.mul_(1 / 255)
        return images.mul_(self.byte_scale).sub_(self.byte_shift)


class DeviceTransforms:
    def __init__(
        self,
        cfg: DeviceTransformsConfig,
        device: torch.device,
        memory_format: torch.memory_format,
        seed: int,
        source: Mapping[str, Any] | None = None,
    ) -> None:
        """`cfg`: the device_transforms group; `source`: the source's own stage (same keys)."""
        stages = [Stage(_Fields(source), device)] if source else []
        self.stages = [s for s in (*stages, Stage(cfg, device)) if s.active]
        self.scale_bytes = Stage.identity(device)  # uint8 with no stage: only to [0, 1]
        self.memory_format, self.seed = memory_format, seed
        self.generator = torch.Generator(device=device)
        self.batches = 0  # training batches transformed so far

    @property
    def active(self) -> bool:
        return bool(self.stages)

    def start_at(self, batches: int) -> None:
        """Continue as if `batches` training batches had been transformed (a resumed run)."""
        self.batches = batches

    def on_batch(self, batch: Any, train: bool) -> Any:
        """The batch with its image input, its first 4-D tensor, transformed (a batch of
        any nesting; none: as it is)."""
        if type(batch) in (list, tuple) and len(batch) == 2:  # a pair: no tree walk
            inputs, targets = batch
            if isinstance(inputs, torch.Tensor):
                return type(batch)((self(inputs, train), targets))
        leaves, spec = tree_flatten(batch)
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor) and leaf.dim() == 4:
                leaves[i] = self(leaf, train)
                return tree_unflatten(leaves, spec)
        return batch

    def __call__(self, images: torch.Tensor, train: bool) -> torch.Tensor:
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            return images  # not a batch of images: nothing here applies
        if images.dtype != torch.uint8 and not self.active:
            return images
        if train:  # cheap on any device: seeding queues no work and reads nothing back
            self.generator.manual_seed(self.seed * _BATCH_SEED_STRIDE + self.batches)
            self.batches += 1
        stages = self.stages
        if images.dtype == torch.uint8:  # the first stage crops and flips the bytes, then
            first = stages[0] if stages else self.scale_bytes  # scales them
            images = first.to_float(first.augment(images, train, self.generator))
            stages = stages[1:]
        for stage in stages:
            images = stage(images, train, self.generator)
        return images.contiguous(memory_format=self.memory_format)


class _Fields:
    """A mapping's keys as attributes, with the group's do-nothing defaults."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.normalize = values.get("normalize", False)
        self.mean, self.std = values.get("mean", [0.0]), values.get("std", [1.0])
        self.hflip, self.crop_padding = values.get("hflip", False), values.get("crop_padding", 0)


def random_crop(images: torch.Tensor, padding: int, generator: torch.Generator) -> torch.Tensor:
    """Each sample: a random HxW window of the image zero-padded by `padding` on every side."""
    n, c, h, w = images.shape
    p, device = padding, images.device
    padded = F.pad(images, (p, p, p, p))
    top = torch.randint(0, 2 * p + 1, (n, 1), device=device, generator=generator)
    left = torch.randint(0, 2 * p + 1, (n, 1), device=device, generator=generator)
    rows = (top + torch.arange(h, device=device))[:, None, :, None]
    cols = (left + torch.arange(w, device=device))[:, None, None, :]
    samples = torch.arange(n, device=device)[:, None, None, None]
    channels = torch.arange(c, device=device)[None, :, None, None]
    return padded[samples, channels, rows, cols]


def random_hflip(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Mirror a random half of the samples left to right."""
    flip = torch.rand(images.shape[0], device=images.device, generator=generator) < 0.5
    return torch.where(flip[:, None, None, None], images.flip(3), images)
