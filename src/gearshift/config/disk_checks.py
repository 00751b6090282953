"""The data node's checks of the built-in sources read from disk (imagefolder, cifar10,
shards): their values, and that their files are there; hf_targets.py's check of data=hf
shares the image values' checks. targets.py's `check_data` loads this module for a run of
one of them only.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from omegaconf import DictConfig

from gearshift.config.disk_targets import (
    BATCH_DTYPES,
    CHECK_IMAGES,
    DECODERS,
    DECODES,
    STAGE_FORMATS,
)
from gearshift.config.rules import check_choice, check_int, fail

# The sources check_disk_data checks, by _target_, with the names their conf/data files have.
DISK_SOURCES = {
    "gearshift.data.images.image_folder": "imagefolder",
    "gearshift.data.images.cifar10": "cifar10",
    "gearshift.data.shards.shards": "shards",
}


def check_disk_data(cfg: DictConfig) -> None:
    """imagefolder, cifar10 and shards: the folder exists, and the values fit the source."""
    data, name = cfg.data, DISK_SOURCES[cfg.data._target_]
    check_image_values(cfg, name)
    if name == "imagefolder" and not 0 <= data.val_fraction < 1:
        fail("data.val_fraction", data.val_fraction, "expected a number >= 0 and < 1")
    if name == "imagefolder":
        check_choice(cfg, "data.check_images", CHECK_IMAGES)
        check_choice(cfg, "data.decode", DECODES)
        _check_gpu_decode(cfg)
        _check_decoding(data)
    if name == "shards":
        check_decoder(data)
        _check_label_key(data)
        _check_val_path(data)
    check_choice(cfg, "data.batch_dtype", BATCH_DTYPES)
    allowed_channels = (3,) if name == "cifar10" else (1, 3)
    if data.channels not in allowed_channels:
        fail(
            "data.channels",
            data.channels,
            f"{name} takes {' or '.join(map(str, allowed_channels))}",
        )
    if name == "cifar10" and data.num_classes != 10:
        fail("data.num_classes", data.num_classes, "CIFAR-10 has 10 classes")
    check_normalisation(data)
    if not data.path:
        fail("data.path", data.path, f"data={name} reads a folder: set data.path=/path/to/it")
    path = Path(data.path).expanduser()
    if name == "shards" and not path.is_dir():
        _check_shard_list(data)
        return
    if not path.is_dir() and not (name == "cifar10" and data.download and not path.exists()):
        what = "not a folder" if path.exists() else "no such folder"
        fix = " or set data.download=true" if name == "cifar10" else ""
        fail("data.path", data.path, f"{what}; point it at the dataset's folder{fix}")
    if data.stage_to:
        stage_to = Path(data.stage_to).expanduser().resolve()
        if stage_to.exists() and not stage_to.is_dir():
            fail("data.stage_to", data.stage_to, "it is a file; expected a folder")
        if stage_to == path.resolve() or path.resolve() in stage_to.parents:
            fail(
                "data.stage_to", data.stage_to, "it lies inside data.path; choose a folder outside"
            )


def check_image_values(cfg: DictConfig, name: str) -> None:
    """What every image source read from disk or a hub checks alike (data=`name`: imagefolder,
    cifar10, shards, hf): its counts and shape, and that it is not made on the device."""
    check_int(cfg, "data.num_samples", 1, optional=True)
    check_int(cfg, "data.num_val_samples", 0, optional=True)
    for key in ("data.image_size", "data.channels"):
        check_int(cfg, key, 1)
    check_int(cfg, "data.num_classes", 2)
    if cfg.data.get("on_device"):
        fail("data.on_device", True, f"only synthetic data is made on the device, not {name}")


def _check_label_key(data: DictConfig) -> None:
    """data=shards without index.json: the member extension that holds the label."""
    key = data.get("label_key", "auto")
    if not (isinstance(key, str) and re.fullmatch(r"auto|[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)?", key)):
        fail(
            "data.label_key",
            key,
            "expected auto (the first of cls, txt, json a sample holds), a member's "
            "extension (cls, txt, json) or json.<field>",
        )


def _check_shard_list(data: DictConfig) -> None:
    """data=shards: data.path names tars (one, a brace list, a glob), read where it is."""
    _check_tars("data.path", data.path, "train")
    if data.stage_to:
        fail("data.stage_to", data.stage_to, "it stages a shard folder; data.path names tars")


def _check_tars(key: str, value: object, split: str) -> None:
    """A shard folder, one .tar or a list of them (a brace list, a glob)."""
    path = str(value)
    if Path(path).expanduser().is_dir() or path.endswith(".tar") or any(c in path for c in "{*?"):
        return
    what = "not a folder" if Path(path).expanduser().exists() else "no such folder"
    fail(
        key,
        value,
        f"{what}; expected a shard folder, one .tar or a list of them "
        f"('/data/{split}-{{000000..000099}}.tar', '/data/{split}-*.tar')",
    )


def _check_val_path(data: DictConfig) -> None:
    """data=shards: data.val_path, the validation shards where data.path holds none."""
    value = data.get("val_path")
    if value is None:
        return
    if not isinstance(value, str) or not value:
        fail("data.val_path", value, "expected a shard folder, one .tar or a list of them")
    _check_tars("data.val_path", value, "val")


def _check_decoding(data: DictConfig) -> None:
    """imagefolder: the decoder is one this machine has; a resized copy has somewhere to go."""
    check_decoder(data)
    check_choice(data, "stage_format", STAGE_FORMATS, "data.")
    if data.stage_format != "copy" and not data.stage_to:
        fail(
            "data.stage_format",
            data.stage_format,
            "a resized copy needs data.stage_to=DIR (a local disk)",
        )
    if not (isinstance(data.stage_quality, int) and 1 <= data.stage_quality <= 100):
        fail("data.stage_quality", data.stage_quality, "expected an integer from 1 to 100")


def check_decoder(data: DictConfig) -> None:
    check_choice(data, "decoder", DECODERS, "data.")
    if data.decoder == "simplejpeg" and importlib.util.find_spec("simplejpeg") is None:
        fail(
            "data.decoder",
            data.decoder,
            "simplejpeg is not installed; pip install 'gearshift[jpeg]' or choose auto",
        )


def _check_gpu_decode(cfg: DictConfig) -> None:
    """data.decode=gpu decodes with nvJPEG on the training device: a CUDA one."""
    import torch

    on_cpu = cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available())
    if cfg.data.decode == "gpu" and on_cpu:
        fail(
            "data.decode",
            "gpu",
            "it decodes JPEGs on a CUDA device and this run trains on the CPU; "
            "use data.decode=host (the loader's workers decode)",
        )
    if cfg.data.decode == "gpu" and cfg.data.stage_format == "raw":
        fail(
            "data.decode",
            "gpu",
            "data.stage_format=raw stores decoded pixels, nothing is left to decode; "
            "use data.decode=host, or data.stage_format=jpeg",
        )


def check_normalisation(data: DictConfig) -> None:
    if (data.mean is None) != (data.std is None):
        fail(
            "data.mean" if data.mean is None else "data.std",
            None,
            "set data.mean and data.std together",
        )
    for key in ("mean", "std"):
        values = data[key]
        if values is not None and len(values) != data.channels:
            fail(f"data.{key}", list(values), f"expected {data.channels} values, one per channel")
    if data.std is not None and min(data.std) <= 0:
        fail("data.std", list(data.std), "expected numbers > 0")
