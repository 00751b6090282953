"""The checks of the features a run may leave off: mixed precision, torch.compile, the
dataloader gears, batch_size=auto's search, the checkpoints' cadence, the sweep presets'
settings, weight averaging, early stopping, the profiler, the plan, several ranks, the
transforms on the device, a scheduler class, a token budget, model.init_from, W&B's mode
and logger=tensorboard, and a device named (cuda, cuda:N).

Each feature's node left at its schema defaults passes its check (tests/test_config.py holds
them to it), so checks.py runs `check_<node>` only for a node that differs from them (and the
other checks where their key is set), and a run that sets none of these features never loads
this module. Each takes the whole config: some read other nodes (ema under fsdp, a memory
snapshot on a CPU).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from omegaconf import DictConfig

from gearshift.config.keyword_checks import check_keywords
from gearshift.config.rules import check_choice, check_int, check_switch, fail, locate
from gearshift.config.schema import (
    AMP_DTYPES,
    BACKENDS,
    COMPILE_ENABLED,
    COMPILE_MODES,
    DEVICES,
    LOGGER_MODES,
    PIN_MEMORY,
    PLAN_DEVICES,
    STRATEGIES,
)

SCHEDULER_CLASS = (
    "expected an importable torch.optim.lr_scheduler.LRScheduler subclass (module.Name) that "
    "steps without a metric, or null: optimizer.schedule"
)


def check_amp(cfg: DictConfig) -> None:
    check_choice(cfg.amp, "dtype", AMP_DTYPES, "amp.")


def check_compile(cfg: DictConfig) -> None:
    check_choice(cfg.compile, "mode", COMPILE_MODES, "compile.")
    check_switch(cfg.compile, "enabled", COMPILE_ENABLED, "compile.")


def check_dataloader(cfg: DictConfig) -> None:
    node, at = cfg.dataloader, "dataloader."
    workers = node.num_workers
    if workers != "auto" and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 0
    ):
        fail(at + "num_workers", workers, "expected an integer >= 0 or auto")
    check_switch(node, "pin_memory", PIN_MEMORY, at)
    check_int(node, "prefetch_factor", 1, optional=True, prefix=at)


def check_checkpoint(cfg: DictConfig) -> None:
    check_int(cfg.checkpoint, "every_n_steps", 1, optional=True, prefix="checkpoint.")
    check_int(cfg.checkpoint, "keep", 1, prefix="checkpoint.")


def check_batch_size_finder(cfg: DictConfig) -> None:
    node, at = cfg.batch_size_finder, "batch_size_finder."
    if node.max_memory_gib is not None and not node.max_memory_gib > 0:
        fail(at + "max_memory_gib", node.max_memory_gib, "expected a number > 0")
    if not 0 < node.memory_fraction <= 1:
        fail(at + "memory_fraction", node.memory_fraction, "expected 0 < x <= 1")
    if not 0 <= node.margin < 1:
        fail(at + "margin", node.margin, "expected 0 <= x < 1")
    check_int(node, "max_batch_size", 8, prefix=at)


def check_sweep(cfg: DictConfig) -> None:
    check_int(cfg.sweep, "rounds", 1, prefix="sweep.")  # range(0, 0) sweeps nothing


def check_ema(cfg: DictConfig) -> None:
    decay = cfg.ema.decay  # fsdp's line before ema's other keys; one out of range: ema's own
    if decay is not None and 0 < decay < 1 and cfg.distributed.strategy == "fsdp":
        fail(
            "ema.decay",
            decay,
            "weight averaging does not shard its copy under distributed=fsdp; "
            "use distributed=ddp or ema.decay=null",
        )
    if decay is not None and not 0 < decay < 1:
        fail("ema.decay", decay, "expected a number > 0 and < 1 (or null to turn it off)")
    check_int(cfg.ema, "every_n_steps", 1, prefix="ema.")
    check_int(cfg.ema, "start_step", 0, prefix="ema.")


def check_early_stop(cfg: DictConfig) -> None:
    node = cfg.early_stop
    check_int(node, "patience", 1, optional=True, prefix="early_stop.")
    if not node.min_delta >= 0:  # NaN too
        fail("early_stop.min_delta", node.min_delta, "expected a number >= 0")


def check_profile(cfg: DictConfig) -> None:
    for key, minimum in (("wait", 0), ("warmup", 0), ("active", 1)):
        check_int(cfg.profile, key, minimum, prefix="profile.")
    if cfg.profile.memory_snapshot:
        import torch

        if cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available()):
            fail(
                "profile.memory_snapshot",
                True,
                "it records the CUDA allocator's history; this run trains on the CPU",
            )


def check_plan(cfg: DictConfig) -> None:
    """A device of the table, whole ranks, a headroom that leaves some memory."""
    check_choice(cfg.plan, "device", PLAN_DEVICES, "plan.")
    check_int(cfg.plan, "world_size", 1, optional=True, prefix="plan.")
    headroom = cfg.plan.headroom
    if isinstance(headroom, bool) or not isinstance(headroom, int | float) or not 0 <= headroom < 1:
        fail("plan.headroom", headroom, "expected a share of the memory, 0 <= headroom < 1")


def check_distributed(cfg: DictConfig) -> None:
    """The values, then the strategy against the processes launched or planned and the
    device."""
    d = cfg.distributed
    check_choice(d, "strategy", STRATEGIES, "distributed.")
    check_choice(d, "backend", BACKENDS, "distributed.")
    for key in ("nproc_per_node", "timeout_s", "bucket_cap_mb"):
        check_int(d, key, 1, prefix="distributed.")
    check_int(d, "max_restarts", 0, prefix="distributed.")
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


def check_device_transforms(cfg: DictConfig) -> None:
    """mean and std: one value, or one per channel of the data; std > 0."""
    channels = cfg.data.get("channels")
    for key in ("mean", "std"):
        values = list(cfg.device_transforms[key])
        if channels is not None and len(values) not in (1, channels):
            fail(
                f"device_transforms.{key}",
                values,
                f"expected one value or one per channel ({channels})",
            )
    if any(not s > 0 for s in cfg.device_transforms.std):
        fail("device_transforms.std", list(cfg.device_transforms.std), "expected values > 0")
    check_int(cfg.device_transforms, "crop_padding", 0, prefix="device_transforms.")


def check_scheduler(cfg: DictConfig) -> None:
    """A scheduler class with the keywords it takes, in place of optimizer.schedule."""
    target = cfg.scheduler._target_
    found = locate("scheduler._target_", target, SCHEDULER_CLASS)
    bases = {f"{c.__module__}.{c.__qualname__}" for c in getattr(found, "__mro__", ())}
    lr_scheduler = "torch.optim.lr_scheduler."
    if f"{lr_scheduler}LRScheduler" not in bases or f"{lr_scheduler}ReduceLROnPlateau" in bases:
        fail("scheduler._target_", target, SCHEDULER_CLASS)
    if cfg.optimizer.schedule != "cosine":
        fail(
            "optimizer.schedule", cfg.optimizer.schedule,
            f"scheduler._target_={target} is the schedule: leave optimizer.schedule at cosine",
        )  # fmt: skip
    keywords = {k: v for k, v in cfg.scheduler.items() if k != "_target_"}
    check_keywords("scheduler", target, keywords, given=("total_steps",))


def check_max_tokens(cfg: DictConfig) -> None:
    """max_tokens: an integer >= 1, also written as a whole float (1e9)."""
    value = cfg.max_tokens
    whole = isinstance(value, float) and value.is_integer()
    if isinstance(value, bool) or not (isinstance(value, int) or whole) or value < 1:
        fail("max_tokens", value, "expected an integer >= 1, e.g. 5000000 or 5e6 (or null)")


def check_init_from(cfg: DictConfig) -> None:
    """model.init_from names a file or a folder (what it holds: state/init_from.py)."""
    init_from = cfg.model.init_from
    if not isinstance(init_from, str) or not Path(init_from).expanduser().exists():
        fail(
            "model.init_from", init_from,
            "no such file or folder; give a checkpoint, a state dict or a Hugging Face "
            "GPT-2 folder (or null)",
        )  # fmt: skip


def check_logger(cfg: DictConfig) -> None:
    """W&B's mode; logger=tensorboard: its package is installed."""
    check_choice(cfg.logger, "mode", LOGGER_MODES, "logger.")
    if cfg.logger.tensorboard and importlib.util.find_spec("tensorboard") is None:
        fail(
            "logger",
            "tensorboard",
            "the tensorboard package is not installed: pip install tensorboard "
            "(or gearshift's extra: pip install -e '.[tensorboard]')",
        )


def check_device(cfg: DictConfig) -> None:
    """A `device` named (not auto or cpu) is one this machine has."""
    import torch

    device = cfg.device
    if device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit()):
        if not torch.cuda.is_available():
            fail("device", device, "this machine has no CUDA device; choose auto or cpu")
        index = int(device[5:]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            fail("device", device, f"this machine has {torch.cuda.device_count()} CUDA device(s)")
        return
    fail("device", device, "choose one of: " + ", ".join(DEVICES))
