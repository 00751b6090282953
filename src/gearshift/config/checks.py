"""Checks of a composed config that types alone cannot express, and of the machine.

`check_config` runs before any work starts and raises `ConfigError` with one line naming
the key, the value and what is allowed.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationKeyError

from gearshift.config.schema import (
    AMP_DTYPES,
    BACKENDS,
    COMPILE_ENABLED,
    COMPILE_MODES,
    DETERMINISTIC,
    DEVICES,
    LOGGER_MODES,
    MATMUL_PRECISIONS,
    ON_NONFINITE,
    OPTIMIZERS,
    PIN_MEMORY,
    PLAN_DEVICES,
    SCHEDULES,
    STRATEGIES,
    TRAINER,
)


class ConfigError(ValueError):
    """A config value that is not allowed; the message is one line for the user."""


class DataError(ConfigError):
    """Data that cannot be read, met while training (a damaged file): the run saves a
    checkpoint at its last optimizer step, then ends with this one line (exit 2)."""

    remedy = "fix the data"

    def after(self, checkpoint: Path | None) -> DataError:
        """This error, its message now saying where training stopped and how to go on."""
        if checkpoint is not None:
            remedy = f"{self.remedy}, then run the same command again to resume"
            self.args = (f"{self}; saved {checkpoint}: {remedy}",)
        return self


# The built-in data sources by their _target_, with the names their conf/data files have;
# their values are checked here, before any run folder exists. A source of your own is
# checked by its own code when it builds the datasets.
SOURCES = {
    "gearshift.data.synthetic.synthetic_images": "synthetic",
    "gearshift.data.synthetic.synthetic_regression": "synthetic_regression",
    "gearshift.data.images.image_folder": "imagefolder",
    "gearshift.data.images.cifar10": "cifar10",
    "gearshift.data.shards.shards": "shards",
}
# Sources with a check of their own, by _target_: data=synthetic_tokens's below, data=tokens's
# in config/token_files.py (it reads the files).
SOURCE_CHECKS: dict[str, Callable[[DictConfig], None]] = {}
# The image sources' keys: their nodes are conf/data/*.yaml, not a schema dataclass.
CHECK_IMAGES = ("header", "decode", "off")
BATCH_DTYPES = ("uint8", "float32")  # data/images.py host_transform
DECODERS = ("auto", "pil", "torchvision", "simplejpeg")  # data/decode.py
STAGE_FORMATS = ("copy", "jpeg", "raw")  # data/resized.py
DECODES = ("host", "gpu")  # data.decode of data=imagefolder (data/gpu_decode.py)
# Data keys that only act on data read from disk, with their do-nothing values.
DISK_ONLY = {
    "path": None,
    "stage_to": None,
    "download": False,
    "decode": "host",
    "augment": False,
    "mean": None,
    "std": None,
    "batch_dtype": "uint8",
    "decoder": "auto",
    "stage_format": "copy",
}


def _fail(key: str, value: Any, allowed: str) -> None:
    raise ConfigError(f"{key}={value!r} is not allowed; {allowed}")


def _check_choice(cfg: DictConfig, key: str, choices: tuple[str, ...], prefix: str = "") -> None:
    value = OmegaConf.select(cfg, key)
    if value not in choices:
        _fail(prefix + key, value, "choose one of: " + ", ".join(choices))


def _check_switch(cfg: DictConfig, key: str, choices: tuple[bool | str, ...]) -> None:
    """A key that is true, false or a word: "choose true, false or auto"."""
    value = OmegaConf.select(cfg, key)
    if value not in choices:
        *first, last = (str(c).lower() if isinstance(c, bool) else c for c in choices)
        _fail(key, value, f"choose {', '.join(first)} or {last}")


def _check_int(cfg: DictConfig, key: str, minimum: int, optional: bool = False) -> None:
    value = OmegaConf.select(cfg, key)
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        extra = " (or null to turn it off)" if optional else ""
        _fail(key, value, f"expected an integer >= {minimum}{extra}")


def _check_max_tokens(cfg: DictConfig) -> None:
    """max_tokens: an integer >= 1, also written as a whole float (1e9), or null."""
    value = cfg.get("max_tokens")
    if value is None:
        return
    whole = isinstance(value, float) and value.is_integer()
    if isinstance(value, bool) or not (isinstance(value, int) or whole) or value < 1:
        _fail("max_tokens", value, "expected an integer >= 1, e.g. 5000000 or 5e6 (or null)")


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
    _fail("device", device, "choose one of: " + ", ".join(DEVICES))


def _check_dataloader(cfg: DictConfig) -> None:
    workers = cfg.dataloader.num_workers
    if workers != "auto" and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 0
    ):
        _fail("dataloader.num_workers", workers, "expected an integer >= 0 or auto")
    _check_switch(cfg, "dataloader.pin_memory", PIN_MEMORY)
    _check_int(cfg, "dataloader.prefetch_factor", 1, optional=True)


def _check_data(cfg: DictConfig) -> None:
    target = cfg.data.get("_target_")
    if not target:
        _fail("data._target_", target, "name the source: a function that returns the datasets")
    if target in SOURCE_CHECKS:
        SOURCE_CHECKS[target](cfg)
        return
    name = SOURCES.get(target)
    if name is None:
        return  # a source of your own: its code checks its values when it builds the data
    from_disk = not name.startswith("synthetic")
    _check_int(cfg, "data.num_samples", 1, optional=from_disk)
    _check_int(cfg, "data.num_val_samples", 0, optional=from_disk)
    for key in ("data.image_size", "data.channels"):
        _check_int(cfg, key, 1)
    if name != "synthetic_regression":
        _check_int(cfg, "data.num_classes", 2)
    if from_disk:
        _check_disk_data(cfg, name)
        return
    for key, idle in DISK_ONLY.items():
        if cfg.data.get(key, idle) != idle:
            _fail(f"data.{key}", cfg.data[key], "it applies to data read from disk only")
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


def _check_disk_data(cfg: DictConfig, name: str) -> None:
    """imagefolder, cifar10 and shards: the folder exists, and the values fit the source."""
    data = cfg.data
    if data.get("on_device"):
        _fail("data.on_device", True, f"only synthetic data is made on the device, not {name}")
    if name == "imagefolder" and not 0 <= data.val_fraction < 1:
        _fail("data.val_fraction", data.val_fraction, "expected a number >= 0 and < 1")
    if name == "imagefolder":
        _check_choice(cfg, "data.check_images", CHECK_IMAGES)
        _check_choice(cfg, "data.decode", DECODES)
        _check_gpu_decode(cfg)
        _check_decoding(data)
    if name == "shards":
        _check_decoder(data)
        _check_label_key(data)
    _check_choice(cfg, "data.batch_dtype", BATCH_DTYPES)
    allowed_channels = (3,) if name == "cifar10" else (1, 3)
    if data.channels not in allowed_channels:
        _fail(
            "data.channels",
            data.channels,
            f"{name} takes {' or '.join(map(str, allowed_channels))}",
        )
    if name == "cifar10" and data.num_classes != 10:
        _fail("data.num_classes", data.num_classes, "CIFAR-10 has 10 classes")
    _check_normalisation(data)
    if not data.path:
        _fail("data.path", data.path, f"data={name} reads a folder: set data.path=/path/to/it")
    path = Path(data.path).expanduser()
    if name == "shards" and not path.is_dir():
        _check_shard_list(data)
        return
    if not path.is_dir() and not (name == "cifar10" and data.download and not path.exists()):
        what = "not a folder" if path.exists() else "no such folder"
        fix = " or set data.download=true" if name == "cifar10" else ""
        _fail("data.path", data.path, f"{what}; point it at the dataset's folder{fix}")
    if data.stage_to:
        stage_to = Path(data.stage_to).expanduser().resolve()
        if stage_to.exists() and not stage_to.is_dir():
            _fail("data.stage_to", data.stage_to, "it is a file; expected a folder")
        if stage_to == path.resolve() or path.resolve() in stage_to.parents:
            _fail(
                "data.stage_to", data.stage_to, "it lies inside data.path; choose a folder outside"
            )


def _check_label_key(data: DictConfig) -> None:
    """data=shards without index.json: the member extension that holds the label."""
    key = data.get("label_key", "auto")
    if not (isinstance(key, str) and re.fullmatch(r"auto|[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)?", key)):
        _fail(
            "data.label_key",
            key,
            "expected auto (the first of cls, txt, json a sample holds), a member's "
            "extension (cls, txt, json) or json.<field>",
        )


def _check_shard_list(data: DictConfig) -> None:
    """data=shards: data.path names tars (one, a brace list, a glob), read where it is."""
    path = str(data.path)
    if not (path.endswith(".tar") or any(c in path for c in "{*?")):
        what = "not a folder" if Path(path).expanduser().exists() else "no such folder"
        _fail(
            "data.path",
            data.path,
            f"{what}; expected a shard folder, one .tar or a list of them "
            "('/data/train-{000000..000099}.tar', '/data/train-*.tar')",
        )
    if data.stage_to:
        _fail("data.stage_to", data.stage_to, "it stages a shard folder; data.path names tars")


def _check_decoding(data: DictConfig) -> None:
    """imagefolder: the decoder is one this machine has; a resized copy has somewhere to go."""
    _check_decoder(data)
    _check_choice(data, "stage_format", STAGE_FORMATS, "data.")
    if data.stage_format != "copy" and not data.stage_to:
        _fail(
            "data.stage_format",
            data.stage_format,
            "a resized copy needs data.stage_to=DIR (a local disk)",
        )
    if not (isinstance(data.stage_quality, int) and 1 <= data.stage_quality <= 100):
        _fail("data.stage_quality", data.stage_quality, "expected an integer from 1 to 100")


def _check_decoder(data: DictConfig) -> None:
    _check_choice(data, "decoder", DECODERS, "data.")
    if data.decoder == "simplejpeg" and importlib.util.find_spec("simplejpeg") is None:
        _fail(
            "data.decoder",
            data.decoder,
            "simplejpeg is not installed; pip install 'gearshift[jpeg]' or choose auto",
        )


def _check_gpu_decode(cfg: DictConfig) -> None:
    """data.decode=gpu decodes with nvJPEG on the training device: a CUDA one."""
    import torch

    on_cpu = cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available())
    if cfg.data.decode == "gpu" and on_cpu:
        _fail(
            "data.decode",
            "gpu",
            "it decodes JPEGs on a CUDA device and this run trains on the CPU; "
            "use data.decode=host (the loader's workers decode)",
        )
    if cfg.data.decode == "gpu" and cfg.data.stage_format == "raw":
        _fail(
            "data.decode",
            "gpu",
            "data.stage_format=raw stores decoded pixels, nothing is left to decode; "
            "use data.decode=host, or data.stage_format=jpeg",
        )


def _check_normalisation(data: DictConfig) -> None:
    if (data.mean is None) != (data.std is None):
        _fail(
            "data.mean" if data.mean is None else "data.std",
            None,
            "set data.mean and data.std together",
        )
    for key in ("mean", "std"):
        values = data[key]
        if values is not None and len(values) != data.channels:
            _fail(f"data.{key}", list(values), f"expected {data.channels} values, one per channel")
    if data.std is not None and min(data.std) <= 0:
        _fail("data.std", list(data.std), "expected numbers > 0")


# What one's own optimizer class and schedule must be (engine/optim.py builds them).
OPTIMIZER_CLASS = "expected an importable torch.optim.Optimizer subclass (module.Name)"
SCHEDULE_FUNCTION = (
    f"choose one of: {', '.join(SCHEDULES)}, or name a function factor(step, total_steps) "
    "-> float (module.name)"
)


def _check_optimizer(cfg: DictConfig) -> None:
    _check_choice(cfg, "optimizer.name", OPTIMIZERS)
    optimizer = cfg.optimizer
    if optimizer.schedule not in SCHEDULES:  # one's own: factor(step, total_steps)
        if "." not in str(optimizer.schedule):
            _fail("optimizer.schedule", optimizer.schedule, SCHEDULE_FUNCTION)
        locate("optimizer.schedule", optimizer.schedule, SCHEDULE_FUNCTION)
    if optimizer.get("_target_"):  # one's own optimizer class
        _check_optimizer_class(optimizer._target_)
    if not optimizer.lr > 0:
        _fail("optimizer.lr", optimizer.lr, "expected a number > 0")
    if math.isinf(optimizer.lr):
        _fail("optimizer.lr", optimizer.lr, "expected a finite number > 0")
    if not optimizer.weight_decay >= 0:  # NaN too
        _fail("optimizer.weight_decay", optimizer.weight_decay, "expected a number >= 0")
    if not optimizer.momentum >= 0:
        _fail("optimizer.momentum", optimizer.momentum, "expected a number >= 0")
    if optimizer.nesterov and not optimizer.momentum > 0:
        _fail("optimizer.nesterov", True, "it needs optimizer.momentum > 0")
    betas = list(optimizer.betas)
    if len(betas) != 2 or not all(0 <= beta < 1 for beta in betas):
        _fail("optimizer.betas", betas, "expected two numbers >= 0 and < 1")
    _check_int(cfg, "optimizer.lr_warmup_steps", 0)
    clip = cfg.optimizer.clip_grad_norm
    if clip is not None and not clip > 0:
        _fail("optimizer.clip_grad_norm", clip, "expected a number > 0 (or null: no clipping)")
    for key in ("muon_lr", "muon_momentum"):
        value = cfg.optimizer.get(key)
        if value is not None and not (0 < value < math.inf if key == "muon_lr" else 0 <= value < 1):  # fmt: skip
            _fail(f"optimizer.{key}", value, "expected a number > 0" if key == "muon_lr" else "expected 0 <= x < 1")  # fmt: skip
    if cfg.optimizer.fused and cfg.optimizer.foreach:
        _fail("optimizer.foreach", True, "it cannot be true together with optimizer.fused=true")


def _check_optimizer_class(target: Any) -> None:
    """`optimizer._target_` names a torch.optim.Optimizer subclass, checked by the names of
    its bases (the config layer does not import torch)."""
    found = locate("optimizer._target_", target, OPTIMIZER_CLASS)
    if not isinstance(found, type):
        _fail("optimizer._target_", target, OPTIMIZER_CLASS)
    bases = {f"{c.__module__}.{c.__qualname__}" for c in found.__mro__}
    if "torch.optim.optimizer.Optimizer" not in bases:
        _fail("optimizer._target_", target, OPTIMIZER_CLASS)


def locate(
    key: str, target: Any, expected: str = "expected an importable class or function (module.Name)"
) -> Any:
    """The class or function `target` names ("module.Name"), or a ConfigError for `key`
    that says what is `expected` there."""
    module, _, name = str(target).rpartition(".")
    try:  # not hydra.utils.get_object: it prints its own multi-line error first
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        found = None
    if not callable(found):  # missing, or a module
        raise ConfigError(f"{key}={target!r} is not allowed; {expected}")
    return found


def _check_importable(key: str, target: Any, what: str) -> None:
    if not target:
        _fail(key, target, f"name the {what} to build")
    locate(key, target)


def _check_trainer(target: Any) -> None:
    """`trainer` names a subclass of Trainer. Checked by the names of its bases: the config
    layer sits below the trainer's and does not import it (a subclass's module has)."""
    _check_importable("trainer", target, "Trainer class")
    found = locate("trainer", target)
    bases = {f"{c.__module__}.{c.__qualname__}" for c in getattr(found, "__mro__", ())}
    if not isinstance(found, type) or TRAINER not in bases:
        _fail("trainer", target, f"it must name a subclass of {TRAINER} (module.Name)")


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
    transforms, channels = cfg.device_transforms, cfg.data.get("channels")
    for key in ("mean", "std"):
        values = list(transforms[key])
        if channels is not None and len(values) not in (1, channels):
            _fail(
                f"device_transforms.{key}",
                values,
                f"expected one value or one per channel ({channels})",
            )
    if any(not s > 0 for s in transforms.std):
        _fail("device_transforms.std", list(transforms.std), "expected values > 0")
    _check_int(cfg, "device_transforms.crop_padding", 0)


def _check_distributed(cfg: DictConfig) -> None:
    import torch

    _check_choice(cfg, "distributed.strategy", STRATEGIES)
    _check_choice(cfg, "distributed.backend", BACKENDS)
    for key in ("distributed.nproc_per_node", "distributed.timeout_s", "distributed.bucket_cap_mb"):
        _check_int(cfg, key, 1)
    _check_int(cfg, "distributed.max_restarts", 0)
    d = cfg.distributed
    launched = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1"))) > 1
    plan = cfg.get("plan") or {}
    planned = plan.get("enabled") and (plan.get("world_size") or 1) > 1  # plan=on: no launch
    if d.strategy in ("ddp", "fsdp") and not launched and not planned and d.nproc_per_node == 1:
        _fail(
            "distributed",
            d.strategy,
            "it needs several processes: launch it with torchrun --nproc_per_node=N train.py ... "
            "or add distributed.nproc_per_node=N",
        )
    if d.strategy == "dp" and (cfg.device == "cpu" or not torch.cuda.is_available()):
        _fail("distributed", "dp", "DataParallel needs CUDA devices; use distributed=ddp on CPU")
    if d.strategy in ("dp", "none") and d.nproc_per_node > 1:
        _fail(
            "distributed.nproc_per_node",
            d.nproc_per_node,
            f"it starts DDP ranks; distributed={d.strategy} runs one process",
        )


def _check_ema_and_early_stop(cfg: DictConfig) -> None:
    decay = cfg.ema.decay
    if decay is not None and not 0 < decay < 1:
        _fail("ema.decay", decay, "expected a number > 0 and < 1 (or null to turn it off)")
    if decay is not None and cfg.distributed.strategy == "fsdp":
        _fail(
            "ema.decay",
            decay,
            "weight averaging does not shard its copy under distributed=fsdp; "
            "use distributed=ddp or ema.decay=null",
        )
    _check_int(cfg, "ema.every_n_steps", 1)
    _check_int(cfg, "ema.start_step", 0)
    _check_int(cfg, "early_stop.patience", 1, optional=True)
    if not cfg.early_stop.min_delta >= 0:  # NaN too
        _fail("early_stop.min_delta", cfg.early_stop.min_delta, "expected a number >= 0")


def _check_logger(cfg: DictConfig) -> None:
    _check_choice(cfg, "logger.mode", LOGGER_MODES)
    if cfg.logger.tensorboard and importlib.util.find_spec("tensorboard") is None:
        _fail(
            "logger",
            "tensorboard",
            "the tensorboard package is not installed: pip install tensorboard "
            "(or gearshift's extra: pip install -e '.[tensorboard]')",
        )


def _check_profile(cfg: DictConfig) -> None:
    import torch

    for key, minimum in (("wait", 0), ("warmup", 0), ("active", 1)):
        _check_int(cfg, f"profile.{key}", minimum)
    cpu = cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available())
    if cfg.profile.memory_snapshot and cpu:
        _fail(
            "profile.memory_snapshot",
            True,
            "it records the CUDA allocator's history; this run trains on the CPU",
        )


def _check_plan(cfg: DictConfig) -> None:
    """plan.*: a device of the table, whole ranks, a headroom that leaves some memory."""
    _check_choice(cfg, "plan.device", PLAN_DEVICES)
    _check_int(cfg, "plan.world_size", 1, optional=True)
    headroom = cfg.plan.headroom
    if isinstance(headroom, bool) or not isinstance(headroom, int | float) or not 0 <= headroom < 1:
        _fail("plan.headroom", headroom, "expected a share of the memory, 0 <= headroom < 1")


def _check_init_from(cfg: DictConfig) -> None:
    """model.init_from names a file or a folder (what it holds: state/init_from.py)."""
    init_from, strict = cfg.model.get("init_from"), cfg.model.get("init_strict", True)
    if not isinstance(strict, bool):
        _fail("model.init_strict", strict, "choose true or false")
    if init_from is None:
        return
    if not isinstance(init_from, str) or not Path(init_from).expanduser().exists():
        _fail(
            "model.init_from", init_from,
            "no such file or folder; give a checkpoint, a state dict or a Hugging Face "
            "GPT-2 folder (or null)",
        )  # fmt: skip


def _check_resume(resume: str | None) -> None:
    if resume not in (None, "auto") and not Path(resume).exists():
        _fail("resume", resume, "no such checkpoint file; give a checkpoint's path, auto or null")


# The data keys of image sources that conf/task/classification.yaml and the image models
# read; a source without them gives the task (and model) their values itself.
IMAGE_KEYS = ("data.num_classes", "data.channels", "data.image_size")
IMAGE_KEYS_HINTS = {
    "task": "task.num_classes=N and task.input_shape=[...] (one sample's inputs' shape, e.g. [12])",
    "model.num_classes": "model.num_classes=N",
    "model.in_shape": "model.in_shape=[...] (one sample's inputs' shape)",
    "model.in_channels": "model.in_channels=N",
}


def _check_resolves(cfg: DictConfig, group: str) -> None:
    """A model or task that reads a key the data lacks (model=gpt on image data) fails here,
    not with a traceback once the run folder exists."""
    for key, value in OmegaConf.to_container(cfg[group], resolve=False).items():
        try:
            node = OmegaConf.select(cfg, f"{group}.{key}", throw_on_missing=False)
            if isinstance(node, (DictConfig, ListConfig)):
                OmegaConf.to_container(node, resolve=True)
        except InterpolationKeyError as error:
            missing = str(error).split("'")[1] if "'" in str(error) else str(error)
            hint = ""
            if missing in ("data.vocab_size", "data.block_size"):
                hint = " (token data has it: data=synthetic_tokens or data=tokens)"
            elif missing in IMAGE_KEYS:  # the default task's and models' nodes follow images
                name = group if group == "task" else f"{group}.{key}"  # both of the task's
                hint = f"; a source without images sets {IMAGE_KEYS_HINTS.get(name, f'{name}=...')}"
            _fail(f"{group}.{key}", value, f"{missing} does not exist in this config{hint}")


def _check_synthetic_tokens(cfg: DictConfig) -> None:
    """data=synthetic_tokens: windows of data.block_size tokens below data.vocab_size."""
    _check_int(cfg, "data.num_samples", 1)
    _check_int(cfg, "data.num_val_samples", 0)
    for key in ("data.block_size", "data.vocab_size", "data.successors"):
        _check_int(cfg, key, 1)


SOURCE_CHECKS["gearshift.data.tokens.synthetic_tokens"] = _check_synthetic_tokens


def _check_hf(cfg: DictConfig) -> None:
    """data=hf: the values data=imagefolder checks, and one place to read from."""
    data = cfg.data
    _check_int(cfg, "data.num_samples", 1, optional=True)
    _check_int(cfg, "data.num_val_samples", 0, optional=True)
    for key in ("data.image_size", "data.channels"):
        _check_int(cfg, key, 1)
    _check_int(cfg, "data.num_classes", 2)
    if data.get("on_device"):
        _fail("data.on_device", True, "only synthetic data is made on the device, not hf")
    if data.channels not in (1, 3):
        _fail("data.channels", data.channels, "hf takes 1 or 3")
    _check_choice(cfg, "data.batch_dtype", BATCH_DTYPES)
    _check_decoder(data)
    _check_normalisation(data)
    if (data.path is None) == (data.name is None):
        _fail(
            "data.path",
            data.path,
            "data=hf reads either data.path (a save_to_disk folder or data files) or "
            "data.name (a dataset in the local cache): set one of them",
        )
    if data.path is not None and not Path(data.path).expanduser().exists():
        _fail("data.path", data.path, "no such file or folder")


SOURCE_CHECKS["gearshift.data.hf.hf"] = _check_hf


def _check_model_takes_tokens(cfg: DictConfig) -> None:
    """Token data (its node has block_size and vocab_size) and a model that reads them (the
    GPT): its context holds a whole window and its embedding every token id; else the
    first step fails inside the model (a reshape or an index out of range)."""
    data, model = cfg.data, cfg.model
    for key, what in (("block_size", "the data's windows are"), ("vocab_size", "the data has")):
        wanted, has = data.get(key), model.get(key)
        if isinstance(wanted, int) and isinstance(has, int) and has < wanted:
            unit = "tokens" if key == "block_size" else "token ids"
            _fail(f"model.{key}", has, f"{what} data.{key}={wanted} {unit}: expected >= {wanted}")


# The parts of a run that check_config imports and checks: all of them for training;
# `evaluate` leaves out the trainer, `export` and `generate` use the model alone, so a
# trainer, task or source of the run's own package need not import where they run.
RUN_PARTS = frozenset({"model", "task", "data", "trainer"})


def check_config(cfg: DictConfig, uses: frozenset[str] = RUN_PARTS) -> None:
    """Raise ConfigError (one line) for the first value that is not allowed, among the
    keys of the parts in `uses` and those every part reads."""
    for key, what in (("model", "model class or function"), ("task", "task class")):
        if key in uses:
            _check_importable(f"{key}._target_", OmegaConf.select(cfg, f"{key}._target_"), what)
    if "trainer" in uses:
        _check_trainer(cfg.trainer)
    _check_choice(cfg, "amp.dtype", AMP_DTYPES)
    _check_choice(cfg, "compile.mode", COMPILE_MODES)
    _check_switch(cfg, "compile.enabled", COMPILE_ENABLED)
    _check_choice(cfg, "matmul_precision", MATMUL_PRECISIONS)
    _check_switch(cfg, "deterministic", DETERMINISTIC)
    _check_logger(cfg)
    for key in ("accum", "epochs", "log_every_n_steps"):
        _check_int(cfg, key, 1)
    _check_batch_size(cfg)
    _check_int(cfg, "warmup_steps", 0)
    _check_int(cfg, "max_steps", 1, optional=True)
    _check_max_tokens(cfg)
    _check_int(cfg, "val_every_n_steps", 1, optional=True)
    _check_int(cfg, "checkpoint.every_n_steps", 1, optional=True)
    _check_int(cfg, "checkpoint.keep", 1)
    _check_int(cfg, "sweep.rounds", 1)  # sweep=ablation's rounds: range(0, 0) sweeps nothing
    _check_resume(cfg.resume)
    _check_init_from(cfg)
    _check_ema_and_early_stop(cfg)
    _check_choice(cfg, "on_nonfinite", ON_NONFINITE)
    _check_profile(cfg)
    _check_plan(cfg)
    _check_distributed(cfg)
    if "data" in uses:
        _check_dataloader(cfg)
        _check_data(cfg)
    _check_resolves(cfg, "model")  # after the data's own checks: they name its files
    if "task" in uses:
        _check_resolves(cfg, "task")
    _check_model_takes_tokens(cfg)
    if "data" in uses:
        _check_device_transforms(cfg)
    _check_optimizer(cfg)
    _check_device(cfg.device)
