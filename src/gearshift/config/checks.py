"""`check_config`, before any work starts: each node's own checks (schema.py, data_checks.py,
targets.py) and those that span nodes; the first value not allowed raises a one-line ConfigError.
"""

from __future__ import annotations

import os

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationKeyError

from gearshift.config import schema as s
from gearshift.config.data_checks import check_data
from gearshift.config.rules import fail
from gearshift.config.targets import check_arguments, check_types

# The parts of a run that check_config imports and checks: all of them for training and
# `evaluate`; `export` and `generate` use the model alone, so a task or source of the
# run's own package need not import where they run.
RUN_PARTS = frozenset({"model", "task", "data"})


def check_config(cfg: DictConfig, uses: frozenset[str] = RUN_PARTS) -> None:
    """Raise ConfigError (one line) for the first value that is not allowed, among the
    keys of the parts in `uses` and those every part reads."""
    s.Config.check_parts(cfg, uses)
    s.AmpConfig.check_node(cfg.amp)
    s.CompileConfig.check_node(cfg.compile)
    s.LoggerConfig.check_node(cfg.logger)
    s.Config.check_node(cfg)
    s.BatchSizeFinderConfig.check_node(cfg.batch_size_finder)
    s.CheckpointConfig.check_node(cfg.checkpoint)
    s.SweepConfig.check_node(cfg.sweep)
    decay = cfg.ema.decay  # fsdp's line before ema's other keys; one out of range: ema's own
    if decay is not None and 0 < decay < 1 and cfg.distributed.strategy == "fsdp":
        fail(
            "ema.decay",
            decay,
            "weight averaging does not shard its copy under distributed=fsdp; "
            "use distributed=ddp or ema.decay=null",
        )
    s.EmaConfig.check_node(cfg.ema)
    s.EarlyStopConfig.check_node(cfg.early_stop)
    s.ProfileConfig.check_node(cfg.profile)
    if cfg.profile.memory_snapshot and _on_cpu(cfg):
        fail(
            "profile.memory_snapshot",
            True,
            "it records the CUDA allocator's history; this run trains on the CPU",
        )
    s.PlanConfig.check_node(cfg.plan)
    s.DistributedConfig.check_node(cfg.distributed)
    _check_launch(cfg)
    if "data" in uses:
        s.DataLoaderConfig.check_node(cfg.dataloader)
        check_types(cfg, "data")
        check_data(cfg)
        check_arguments(cfg, "data")
    _check_resolves(cfg, "model")  # after the data's own checks: they name its files
    if "task" in uses:
        _check_resolves(cfg, "task")
    for group in ("model", "task"):  # resolved now: the values, then the target's keywords
        if group in uses:
            check_types(cfg, group)
            check_arguments(cfg, group)
    _check_model_takes_tokens(cfg)
    if "data" in uses:
        _check_channels(cfg)
        s.DeviceTransformsConfig.check_node(cfg.device_transforms)
    s.OptimizerConfig.check_node(cfg.optimizer)
    s.SchedulerConfig.check_node(cfg.scheduler, cfg.optimizer)
    s.Config.check_device(cfg.device)


def _on_cpu(cfg: DictConfig) -> bool:
    import torch

    return cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available())


def _check_launch(cfg: DictConfig) -> None:
    """The strategy against the processes launched or planned and the device."""
    d = cfg.distributed
    launched = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1"))) > 1
    plan = cfg.get("plan") or {}
    planned = plan.get("enabled") and (plan.get("world_size") or 1) > 1  # plan=on: no launch
    if d.strategy in ("ddp", "fsdp") and not launched and not planned and d.nproc_per_node == 1:
        fail(
            "distributed",
            d.strategy,
            "it needs several processes: launch it with torchrun --nproc_per_node=N train.py ... "
            "or add distributed.nproc_per_node=N",
        )
    import torch

    if d.strategy == "dp" and (cfg.device == "cpu" or not torch.cuda.is_available()):
        fail("distributed", "dp", "DataParallel needs CUDA devices; use distributed=ddp on CPU")
    if d.strategy in ("dp", "none") and d.nproc_per_node > 1:  # after dp's: its line first
        fail(
            "distributed.nproc_per_node",
            d.nproc_per_node,
            f"it starts DDP ranks; distributed={d.strategy} runs one process",
        )


def _check_channels(cfg: DictConfig) -> None:
    """device_transforms.mean and std: one value, or one per channel of the data."""
    channels = cfg.data.get("channels")
    for key in ("mean", "std"):
        values = list(cfg.device_transforms[key])
        if channels is not None and len(values) not in (1, channels):
            fail(
                f"device_transforms.{key}",
                values,
                f"expected one value or one per channel ({channels})",
            )


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
            fail(f"{group}.{key}", value, f"{missing} does not exist in this config{hint}")


def _check_model_takes_tokens(cfg: DictConfig) -> None:
    """Token data (its node has block_size and vocab_size) and a model that reads them (the
    GPT): its context holds a whole window and its embedding every token id; else the
    first step fails inside the model (a reshape or an index out of range)."""
    data, model = cfg.data, cfg.model
    for key, what in (("block_size", "the data's windows are"), ("vocab_size", "the data has")):
        wanted, has = data.get(key), model.get(key)
        if isinstance(wanted, int) and isinstance(has, int) and has < wanted:
            unit = "tokens" if key == "block_size" else "token ids"
            fail(f"model.{key}", has, f"{what} data.{key}={wanted} {unit}: expected >= {wanted}")
