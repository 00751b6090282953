"""The typed schema of a run's config, and the checks types alone cannot express.

The dataclasses are registered with Hydra's ConfigStore as `gearshift_schema`, the first
entry of conf/config.yaml's defaults, so a wrong type fails while Hydra composes the
config. `check_config` then checks values and the machine (is CUDA there?) before any
work starts, and raises `ConfigError` with one line naming the key, the value and what
is allowed.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf


class ConfigError(ValueError):
    """A config value that is not allowed; the message is one line for the user."""


@dataclass
class AmpConfig:
    dtype: str = "none"  # none | auto (bf16 where supported, else fp16) | bfloat16 | float16


@dataclass
class MemoryFormatConfig:
    channels_last: bool = False


@dataclass
class DataLoaderConfig:
    num_workers: Any = 0  # int >= 0, or "auto": 4 per device, capped by the CPUs
    pin_memory: Any = False  # bool, or "auto": on when training on CUDA
    persistent_workers: bool = False
    prefetch_factor: int | None = None
    non_blocking: bool = False
    drop_last: bool = False
    prefetch_to_device: bool = False  # CUDA: copy the next batch on a side stream (prefetch.py)


@dataclass
class CompileConfig:
    enabled: bool = False
    mode: str = "default"
    fullgraph: bool = False
    dynamic: bool | None = None


@dataclass
class DataConfig:
    name: str = "synthetic"
    num_samples: int = 4096
    num_val_samples: int = 512
    image_size: int = 32
    channels: int = 3
    num_classes: int = 10
    noise: float = 1.0  # synthetic: std of the noise around each class's pattern
    on_device: bool = True  # synthetic: generate on the device (no loader, no copies)


@dataclass
class DeviceTransformsConfig:
    """Normalisation and simple augmentation on the training device (device_transforms.py)."""

    normalize: bool = False
    mean: list[float] = field(default_factory=lambda: [0.0])  # one value, or one per channel
    std: list[float] = field(default_factory=lambda: [1.0])
    hflip: bool = False  # random horizontal flip, half of the training samples
    crop_padding: int = 0  # > 0: random crop of the zero-padded training image


@dataclass
class BatchSizeFinderConfig:
    """How `batch_size=auto` searches (batch_finder.py)."""

    max_memory_gib: float | None = None  # null: CPU = memory_fraction of the available RAM
    memory_fraction: float = 0.5
    margin: float = 0.1  # back off this share from the largest size that fit
    max_batch_size: int = 4096


@dataclass
class OptimizerConfig:
    name: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.9
    nesterov: bool = False
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    weight_decay: float = 5e-4
    foreach: bool | None = None  # None: torch's default
    fused: bool = False
    set_to_none: bool = False
    schedule: str = "cosine"  # constant | cosine
    lr_warmup_steps: int = 0


@dataclass
class LoggerConfig:
    name: str = "wandb"  # wandb | none
    project: str = "gearshift"
    entity: str | None = None
    mode: str = "auto"  # auto (online with an API key, else offline) | online | offline | disabled
    group: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class Config:
    model: dict[str, Any] = MISSING  # instantiated through its _target_
    data: DataConfig = MISSING
    dataloader: DataLoaderConfig = MISSING
    optimizer: OptimizerConfig = MISSING
    amp: AmpConfig = MISSING
    memory_format: MemoryFormatConfig = MISSING
    compile: CompileConfig = MISSING
    logger: LoggerConfig = MISSING
    device_transforms: DeviceTransformsConfig = field(default_factory=DeviceTransformsConfig)
    batch_size_finder: BatchSizeFinderConfig = field(default_factory=BatchSizeFinderConfig)
    batch_size: Any = 64  # per device: an integer >= 1, or "auto" (batch_finder.py)
    accum: int = 1
    epochs: int = 2
    max_steps: int | None = None  # when set, wins over epochs
    warmup_steps: int = 5  # optimizer steps left out of the throughput figures
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    log_every_n_steps: int = 10
    val_every_n_steps: int | None = None  # None: validate once, at the end
    cudnn_benchmark: bool = False
    matmul_precision: str = "highest"  # highest | high | medium
    progress_bar: bool = True


ConfigStore.instance().store(name="gearshift_schema", node=Config)


AMP_DTYPES = ("none", "auto", "bfloat16", "float16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
MATMUL_PRECISIONS = ("highest", "high", "medium")
OPTIMIZERS = ("sgd", "adamw")
SCHEDULES = ("constant", "cosine")
LOGGERS = ("wandb", "none")
LOGGER_MODES = ("auto", "online", "offline", "disabled")
DATASETS = ("synthetic",)


def _fail(key: str, value: Any, allowed: str) -> None:
    raise ConfigError(f"{key}={value!r} is not allowed; {allowed}")


def _check_choice(cfg: DictConfig, key: str, choices: tuple[str, ...]) -> None:
    value = OmegaConf.select(cfg, key)
    if value not in choices:
        _fail(key, value, "choose one of: " + ", ".join(choices))


def _check_int(cfg: DictConfig, key: str, minimum: int, optional: bool = False) -> None:
    value = OmegaConf.select(cfg, key)
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        extra = " (or null to turn it off)" if optional else ""
        _fail(key, value, f"expected an integer >= {minimum}{extra}")


def _check_device(device: str) -> None:
    import torch

    if device in ("auto", "cpu"):
        return
    if device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit()):
        if not torch.cuda.is_available():
            _fail("device", device, "this machine has no CUDA device; choose auto or cpu")
        index = int(device[5:]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            _fail("device", device, f"this machine has {torch.cuda.device_count()} CUDA device(s)")
        return
    _fail("device", device, "choose one of: auto, cpu, cuda, cuda:N")


def _check_dataloader(cfg: DictConfig) -> None:
    workers = cfg.dataloader.num_workers
    if workers != "auto" and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 0
    ):
        _fail("dataloader.num_workers", workers, "expected an integer >= 0 or auto")
    if cfg.dataloader.pin_memory not in ("auto", True, False):
        _fail("dataloader.pin_memory", cfg.dataloader.pin_memory, "choose true, false or auto")
    _check_int(cfg, "dataloader.prefetch_factor", 1, optional=True)


def _check_data(cfg: DictConfig) -> None:
    _check_choice(cfg, "data.name", DATASETS)
    for key in ("data.num_samples", "data.image_size", "data.channels"):
        _check_int(cfg, key, 1)
    _check_int(cfg, "data.num_val_samples", 0)
    _check_int(cfg, "data.num_classes", 2)
    if (
        cfg.dataloader.drop_last
        and cfg.batch_size != "auto"
        and cfg.data.num_samples < cfg.batch_size
    ):
        _fail(
            "batch_size",
            cfg.batch_size,
            f"with dataloader.drop_last=true it must be <= data.num_samples ({cfg.data.num_samples})",
        )


def _check_optimizer(cfg: DictConfig) -> None:
    _check_choice(cfg, "optimizer.name", OPTIMIZERS)
    _check_choice(cfg, "optimizer.schedule", SCHEDULES)
    if not cfg.optimizer.lr > 0:
        _fail("optimizer.lr", cfg.optimizer.lr, "expected a number > 0")
    if cfg.optimizer.weight_decay < 0:
        _fail("optimizer.weight_decay", cfg.optimizer.weight_decay, "expected a number >= 0")
    _check_int(cfg, "optimizer.lr_warmup_steps", 0)
    if cfg.optimizer.fused and cfg.optimizer.foreach:
        _fail("optimizer.foreach", True, "it cannot be true together with optimizer.fused=true")


def _check_model(cfg: DictConfig) -> None:
    target = OmegaConf.select(cfg, "model._target_")
    if not target:
        _fail("model._target_", target, "name the model class or function to build")
    module, _, name = str(target).rpartition(".")
    try:
        getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        _fail("model._target_", target, "expected an importable class or function (module.Name)")


def _check_batch_size(cfg: DictConfig) -> None:
    value = cfg.batch_size
    if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        _fail("batch_size", value, "expected an integer >= 1 or auto")
    finder = cfg.batch_size_finder
    if finder.max_memory_gib is not None and not finder.max_memory_gib > 0:
        _fail("batch_size_finder.max_memory_gib", finder.max_memory_gib, "expected a number > 0")
    if not 0 < finder.memory_fraction <= 1:
        _fail("batch_size_finder.memory_fraction", finder.memory_fraction, "expected 0 < x <= 1")
    if not 0 <= finder.margin < 1:
        _fail("batch_size_finder.margin", finder.margin, "expected 0 <= x < 1")
    _check_int(cfg, "batch_size_finder.max_batch_size", 8)


def _check_device_transforms(cfg: DictConfig) -> None:
    transforms, channels = cfg.device_transforms, cfg.data.channels
    for key in ("mean", "std"):
        values = list(transforms[key])
        if len(values) not in (1, channels):
            _fail(
                f"device_transforms.{key}",
                values,
                f"expected one value or one per channel ({channels})",
            )
    if any(not s > 0 for s in transforms.std):
        _fail("device_transforms.std", list(transforms.std), "expected values > 0")
    _check_int(cfg, "device_transforms.crop_padding", 0)


def check_config(cfg: DictConfig) -> None:
    """Raise ConfigError (one line) for the first value that is not allowed."""
    _check_model(cfg)
    _check_choice(cfg, "amp.dtype", AMP_DTYPES)
    _check_choice(cfg, "compile.mode", COMPILE_MODES)
    _check_choice(cfg, "matmul_precision", MATMUL_PRECISIONS)
    _check_choice(cfg, "logger.name", LOGGERS)
    _check_choice(cfg, "logger.mode", LOGGER_MODES)
    for key in ("accum", "epochs", "log_every_n_steps"):
        _check_int(cfg, key, 1)
    _check_batch_size(cfg)
    _check_int(cfg, "warmup_steps", 0)
    _check_int(cfg, "max_steps", 1, optional=True)
    _check_int(cfg, "val_every_n_steps", 1, optional=True)
    _check_dataloader(cfg)
    _check_data(cfg)
    _check_device_transforms(cfg)
    _check_optimizer(cfg)
    _check_device(cfg.device)
