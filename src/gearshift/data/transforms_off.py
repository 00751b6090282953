"""Which device transforms a run applies (`run.transforms`), and `device_transforms=off`'s
(docs/gears.md, "+ Device transforms"): DeviceTransforms (device_transforms.py) loads
only where the group or the source's own stage switches any on, or images arrive as bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._pytree import tree_leaves

from gearshift.config.schema import DeviceTransformsConfig

if TYPE_CHECKING:
    from gearshift.data.device_transforms import DeviceTransforms


def describe_transforms(cfg: DeviceTransformsConfig) -> str:
    """The switched-on transforms, for the summary's gears: e.g. "normalize+hflip+crop4"."""
    crop = f"crop{cfg.crop_padding}"
    switches = {"normalize": cfg.normalize, "hflip": cfg.hflip, crop: cfg.crop_padding}
    return "+".join(name for name, on in switches.items() if on) or "off"


def source_transforms(dataset: Any) -> Mapping[str, Any] | None:
    """The transforms a source left to the device (its `device_transforms` attribute)."""
    return getattr(dataset, "device_transforms", None)


def build_transforms(
    cfg: DeviceTransformsConfig,
    device: torch.device,
    memory_format: torch.memory_format,
    seed: int,
    dataset: Any,
) -> DeviceTransforms | Untransformed:
    """The transforms of batches from `dataset` (the training set): the source's own stage,
    then the `device_transforms` group's (`cfg`)."""
    source = source_transforms(dataset)

    def make() -> DeviceTransforms:
        from gearshift.data.device_transforms import DeviceTransforms

        return DeviceTransforms(cfg, device, memory_format, seed, source)

    return make() if source or describe_transforms(cfg) != "off" else Untransformed(make)


class Untransformed:
    """The batches as they are, but for images that are bytes: DeviceTransforms (made by
    `make` at the first such batch) turns those into floats in [0, 1]."""

    def __init__(self, make: Callable[[], DeviceTransforms]) -> None:
        self.make, self.scaling = make, None

    def start_at(self, batches: int) -> None:
        """Nothing to move on: no transform here draws at random."""

    def on_batch(self, batch: Any, train: bool) -> Any:
        if self.scaling is None:
            if not _byte_images(batch):
                return batch
            self.scaling = self.make()
        return self.scaling.on_batch(batch, train)


def _byte_images(batch: Any) -> bool:
    """Whether the batch's first 4-D tensor (its images, as DeviceTransforms finds them) is
    uint8."""
    pair = type(batch) in (list, tuple) and len(batch) == 2 and isinstance(batch[0], torch.Tensor)
    leaves = batch if pair else tree_leaves(batch)  # a pair: no tree walk
    images = next((x for x in leaves if isinstance(x, torch.Tensor) and x.dim() == 4), None)
    return images is not None and images.dtype == torch.uint8
