"""The keys of the image sources read from disk (data=imagefolder, cifar10, shards; and
those all of them share with data=hf, hf_targets.py), typed: targets.py's descriptions of
these sources, and the values disk_checks.py checks again; loaded by a run of one of them
(targets.py `check_types`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gearshift.config.targets import DataNode

CHECK_IMAGES = ("header", "decode", "off")
BATCH_DTYPES = ("uint8", "float32")  # data/images.py host_transform
DECODERS = ("auto", "pil", "torchvision", "simplejpeg")  # data/decode.py
STAGE_FORMATS = ("copy", "jpeg", "raw")  # data/resized.py
DECODES = ("host", "gpu")  # data.decode of data=imagefolder (data/gpu_decode.py)


@dataclass
class ImagesNode(DataNode):
    """The keys every image source read from disk has."""

    path: str | None  # null: disk_checks.py asks for the folder
    num_classes: int
    image_size: int
    channels: int
    num_samples: int | None
    num_val_samples: int | None
    split_seed: int
    augment: bool
    mean: list[float] | None
    std: list[float] | None
    batch_dtype: Literal[BATCH_DTYPES]


@dataclass
class Cifar10Node(ImagesNode):
    download: bool


@dataclass
class ImageFolderNode(ImagesNode):
    val_fraction: float
    check_images: Literal[CHECK_IMAGES]
    decode: Literal[DECODES]
    stage_format: Literal[STAGE_FORMATS]
    stage_quality: int
    decoder: Literal[DECODERS]


@dataclass
class ShardsNode(ImagesNode):
    val_path: str | list[str] | None  # the validation shards where `path` holds none
    decoder: Literal[DECODERS]
    streaming: bool
    label_key: str
