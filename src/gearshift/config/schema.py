"""The typed schema of a run's config, registered with Hydra's ConfigStore as
`gearshift_schema` (conf/config.yaml's first default), so a wrong type fails while Hydra
composes the config; its field comments and value constants are docs/config-reference.md's.
`check_node` of Config and OptimizerConfig checks what types cannot (checks.py runs them; the
nodes a run may leave at their defaults: feature_checks.py).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from gearshift.config.rules import binds, check_choice, check_int, check_switch, fail, locate

AMP_DTYPES = ("none", "auto", "bfloat16", "float16")


@dataclass
class AmpConfig:
    dtype: str = "none"  # AMP_DTYPES; auto (amp=on): bf16 where it is fast, else fp16 or none


@dataclass
class MemoryFormatConfig:
    channels_last: bool = False  # NHWC weights and 4-D inputs (tip 16)


PIN_MEMORY = (True, False, "auto")


@dataclass
class DataLoaderConfig:
    num_workers: Any = 0  # int >= 0, or "auto": 4 per device, capped by the CPUs
    pin_memory: Any = False  # PIN_MEMORY; auto: on when training on CUDA
    persistent_workers: bool = False  # workers live on between epochs
    prefetch_factor: int | None = None  # batches each worker loads ahead; null: torch's default
    non_blocking: bool = False  # host-to-device copies that do not wait (tip 7)
    drop_last: bool = False  # drop each epoch's short last batch
    prefetch_to_device: bool = False  # CUDA: copy the next batch on a side stream (prefetch.py)


COMPILE_ENABLED = (True, False, "auto")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass
class CompileConfig:
    enabled: Any = False  # COMPILE_ENABLED; auto: on CUDA only (compiled models ran slower on CPUs)
    mode: str = "default"  # COMPILE_MODES; torch.compile's mode
    fullgraph: bool = False  # true: a graph break is an error
    dynamic: bool | None = None  # dynamic shapes; null: torch decides


@dataclass
class DeviceTransformsConfig:
    """Normalisation and simple augmentation on the training device (device_transforms.py)."""

    normalize: bool = False  # subtract mean, divide by std, batch-wide
    mean: list[float] = field(default_factory=lambda: [0.0])  # one value, or one per channel
    std: list[float] = field(default_factory=lambda: [1.0])  # one value, or one per channel
    hflip: bool = False  # random horizontal flip, half of the training samples
    crop_padding: int = 0  # > 0: random crop of the zero-padded training image


@dataclass
class BatchSizeFinderConfig:
    """How `batch_size=auto` searches (batch_finder.py)."""

    max_memory_gib: float | None = None  # null: CPU = memory_fraction of the available RAM
    memory_fraction: float = 0.5  # CPU: the share of the available RAM to fill
    margin: float = 0.1  # back off this share from the largest size that fit
    max_batch_size: int = 4096  # the largest size it returns


OPTIMIZERS = ("sgd", "adamw", "muon")
# The class each preset of conf/optimizer/ builds: gears.optimizer names the preset while its
# _target_ is this class (muon: Muon on the hidden matrices, AdamW on the rest).
PRESET_CLASSES = dict(sgd="torch.optim.SGD", adamw="torch.optim.AdamW", muon="torch.optim.Muon")
MUON_KEYS = ("muon_lr", "muon_momentum")  # optimizer=muon: Muon's lr and momentum
SCHEDULES = ("constant", "cosine")
# What one's own schedule must be (engine/optim.py calls it).
SCHEDULE_FUNCTION = (
    f"choose one of: {', '.join(SCHEDULES)}, or name a function factor(step, total_steps) "
    "-> float (module.name)"
)


@dataclass
class OptimizerConfig:
    """The optimizer node: `_target_`, a torch.optim.Optimizer class, built with the node's
    other keys as its keywords (null: the class's default) but for the loop's own below; the
    preset (conf/optimizer/) adds its class's keywords, `++optimizer.KEY=VALUE` any other."""

    _target_: str | None = None  # the class (module.Name); null: the preset `name`'s
    name: str | None = None  # OPTIMIZERS; the preset, recorded as gears.optimizer
    lr: float = 0.05  # the peak learning rate (AdamW's under muon), a keyword of the class
    fused: bool = False  # true: passed as fused=True, one kernel for the update; false: not passed
    foreach: bool | None = None  # passed when set: one kernel per op over all tensors
    # the loop's, as those below (never passed); false: biases and norm gains not decayed
    weight_decay_1d: bool = True
    set_to_none: bool = False  # zero_grad(set_to_none=True): free the gradients (tip 12)
    # SCHEDULES, or one's own factor(step, total_steps) -> float (module.name) scaling lr
    schedule: str = "cosine"
    lr_warmup_steps: int = 0  # linear warm-up of the lr over these steps, before any schedule
    clip_grad_norm: float | None = None  # > 0: the gradients' total L2 norm is clipped to it

    @staticmethod
    def keywords(node: DictConfig | dict[str, Any]) -> dict[str, Any]:
        """What the class is built with: every key but the loop's and the null ones; fused
        only when true."""
        own = {f.name for f in fields(OptimizerConfig)} - {"lr", "fused", "foreach"}
        return {
            k: v for k, v in node.items()
            if k not in own and v is not None and not (k == "fused" and v is False)
        }  # fmt: skip

    @staticmethod
    def target(node: DictConfig) -> str | None:
        """The class the node names: its _target_, else its preset's."""
        return node.get("_target_") or PRESET_CLASSES.get(str(node.get("name")))

    @staticmethod
    def is_muon(node: DictConfig) -> bool:
        """optimizer=muon as its preset builds it (Muon + AdamW), not a class named in place."""
        return node.get("name") == "muon" and OptimizerConfig.target(node) == PRESET_CLASSES["muon"]

    @staticmethod
    def check_node(node: DictConfig) -> None:
        at = "optimizer."
        if node.get("name") is not None:
            check_choice(node, "name", OPTIMIZERS, at)
        if node.schedule not in SCHEDULES:  # one's own: factor(step, total_steps)
            if "." not in str(node.schedule):
                fail(at + "schedule", node.schedule, SCHEDULE_FUNCTION)
            locate(at + "schedule", node.schedule, SCHEDULE_FUNCTION)
        target = OptimizerConfig.target(node)
        if target not in (PRESET_CLASSES["sgd"], PRESET_CLASSES["adamw"]):
            # a class of one's own, or Muon (not in every torch): an Optimizer subclass?
            from gearshift.config.keyword_checks import check_optimizer_class

            check_optimizer_class(target)
        lr = number(node, "lr", at, "expected a number > 0")
        if lr is None or not lr > 0:  # null too: the class would get lr=None
            fail(at + "lr", lr, "expected a number > 0")
        if math.isinf(lr):
            fail(at + "lr", lr, "expected a finite number > 0")
        for key in ("weight_decay", "momentum"):
            value = number(node, key, at, "expected a number >= 0")
            if value is not None and not value >= 0:  # NaN too
                fail(at + key, value, "expected a number >= 0")
        if node.get("nesterov") and not (node.get("momentum") or 0) > 0:
            fail(at + "nesterov", True, "it needs optimizer.momentum > 0")
        if node.get("betas") is not None:
            betas = list(node.betas)
            if len(betas) != 2 or not all(0 <= beta < 1 for beta in betas):
                fail(at + "betas", betas, "expected two numbers >= 0 and < 1")
        check_int(node, "lr_warmup_steps", 0, prefix=at)
        clip = number(node, "clip_grad_norm", at, "expected a number > 0 (or null: no clipping)")
        if clip is not None and not clip > 0:
            fail(at + "clip_grad_norm", clip, "expected a number > 0 (or null: no clipping)")
        for key in MUON_KEYS:
            value = node.get(key)
            if value is not None and not (0 < value < math.inf if key == "muon_lr" else 0 <= value < 1):  # fmt: skip
                fail(at + key, value, "expected a number > 0" if key == "muon_lr" else "expected 0 <= x < 1")  # fmt: skip
        for key in ("fused", "weight_decay_1d", "set_to_none"):
            if not isinstance(node.get(key), bool):
                fail(at + key, node.get(key), "choose true or false")
        if node.foreach not in (True, False, None):
            fail(at + "foreach", node.foreach, "choose true, false or null (torch's default)")
        if node.fused and node.foreach:
            fail(at + "foreach", True, "it cannot be true together with optimizer.fused=true")
        keywords = OptimizerConfig.keywords(node)
        if OptimizerConfig.is_muon(node):  # Muon takes muon_*, AdamW the rest
            keywords = {k: v for k, v in keywords.items() if k not in MUON_KEYS}
            target = PRESET_CLASSES["adamw"]
        if not binds(locate("optimizer._target_", target), None, **keywords):  # None: params
            from gearshift.config.keyword_checks import check_keywords

            check_keywords("optimizer", target, keywords)


@dataclass
class SchedulerConfig:
    """The scheduler node: `_target_`, a torch.optim.lr_scheduler class (torch's or one's
    own), built per optimizer as `cls(optimizer, **the node's other keys)` and stepped once
    per optimizer step after the warm-up (docs/make-it-yours.md); null: optimizer.schedule."""

    _target_: str | None = None  # the class (module.Name); null: optimizer.schedule


def number(node: DictConfig, key: str, at: str, expected: str) -> float | None:
    """The node's `key` as a float (the command line's `-1` an int: said as -1.0), or None."""
    value = node.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        fail(at + key, value, expected)
    return float(value)


LOGGER_MODES = ("auto", "online", "offline", "disabled")


@dataclass
class LoggerConfig:
    """Where metrics go (observe/loggers.py): each backend on or off, so the options of the
    `logger` group compose (`logger=[wandb,csv]`); the other keys are W&B's."""

    wandb: bool = False  # W&B, online or offline (mode)
    tensorboard: bool = False  # TensorBoard event files in <run folder>/tensorboard
    csv: bool = False  # <run folder>/metrics.csv: step,name,value rows
    project: str = "gearshift"  # the W&B project
    entity: str | None = None  # the W&B entity (team or user); null: your default
    mode: str = "auto"  # LOGGER_MODES; auto: online with an API key, else offline
    group: str | None = None  # the W&B group; null: a sweep's folder name
    tags: list[str] = field(default_factory=list)  # W&B tags


STRATEGIES = ("auto", "none", "ddp", "dp", "fsdp")
BACKENDS = ("auto", "nccl", "gloo")


@dataclass
class DistributedConfig:
    strategy: str = "auto"  # STRATEGIES; auto: DDP when launched as several ranks
    nproc_per_node: int = 1  # > 1: start that many ranks here (torch's elastic launcher)
    max_restarts: int = 0  # for the ranks started here: restarts after a rank fails
    backend: str = "auto"  # BACKENDS; auto: nccl on CUDA, gloo on CPU
    timeout_s: int = 300  # a collective waiting this long for a dead rank fails the job
    sync_batchnorm: bool = False  # SyncBatchNorm across ranks
    bucket_cap_mb: int = 25  # DDP's gradient bucket size
    gradient_as_bucket_view: bool = False  # DDP: gradients as views into the buckets
    static_graph: bool = False  # DDP: the graph is the same every step


@dataclass
class CheckpointConfig:
    every_n_steps: int | None = None  # None: only at the end (and on SIGTERM/SIGUSR1)
    at_end: bool = True  # a checkpoint at the run's end
    keep: int = 2  # the newest checkpoints kept in <run folder>/checkpoints
    async_save: bool = False  # write in the background; the loop waits only for the copy


@dataclass
class EmaConfig:
    """Weight averaging (engine/ema.py): an EMA of the weights, validated and saved too."""

    decay: float | None = None  # null: off; e.g. 0.999 (0 < decay < 1)
    every_n_steps: int = 1  # fold the weights in every N optimizer steps
    start_step: int = 0  # before this step the average follows the weights


@dataclass
class EarlyStopConfig:
    """End the run when the task's monitor metric stops improving (state/best.py)."""

    patience: int | None = None  # validations without an improvement; null: off
    min_delta: float = 0.0  # an improvement beats the best by more than this


@dataclass
class ProfileConfig:
    """`profile=on`: torch.profiler over a window of steps (observe/profiler.py); and, on CUDA,
    the allocator's history (observe/memory_snapshot.py), on or off by itself."""

    enabled: bool = False  # profile=on
    wait: int = 1  # steps after warmup_steps before the profiler starts
    warmup: int = 1  # the profiler's own warm-up: recorded, then discarded
    active: int = 3  # steps in the trace and ops.txt
    record_shapes: bool = False  # input shapes in the trace
    with_stack: bool = False  # Python stacks in the trace
    profile_memory: bool = False  # tensor memory in the trace
    memory_snapshot: bool = False  # CUDA: profile/memory_snapshot.pickle, at the end and on OOM


# plan.device: the run's own device (auto), the CPU, or a GPU of observe/gpu_datasheets.py's table
PLAN_DEVICES = (
    "auto", "cpu", "h200", "h200_nvl", "h100", "h100_nvl", "h100_pcie", "a100", "l40s", "l4",
    "a10", "v100", "t4",
)  # fmt: skip


@dataclass
class PlanConfig:
    """`plan=on`: the run's memory and step time, traced under fake tensors (observe/plan.py),
    printed without training (docs/planning.md)."""

    enabled: bool = False  # plan=on: print the plan and exit 0, no run folder
    device: str = "auto"  # PLAN_DEVICES; auto: the device the run would train on
    world_size: int | None = None  # ranks to plan for; null: the run's
    headroom: float = 0.1  # the share of the device's memory left free by the largest batch
    check: bool = False  # the plan beside the measured peak and step time in summary.json


@dataclass
class SweepConfig:
    """Settings of the sweep presets (conf/sweep/): `sweep=ablation` reads them."""

    rounds: int = 5  # the ablation's rounds: each runs every configuration once (seed=round)


@dataclass
class TrialConfig:
    """A run that is one trial of a study: the sweeper (hydra/sweeper=gearshift_optuna) sets
    this node for each trial it launches (docs/optuna.md); a run of its own leaves it null."""

    reporter: str | None = None  # the reporter's class (module.Name); null: the run reports nowhere
    storage: str | None = None  # where the study lives: a journal file, or a database URL
    study: str | None = None  # the study's name
    number: int | None = None  # the trial's number (= its run folder under the sweep folder)


# The model node's keys that are gearshift's, not the model's arguments (models/factory.py):
# init_from: a checkpoint or a Hugging Face GPT-2 folder whose weights the model starts from;
# init_strict: false loads the tensors that fit and lists the rest.
MODEL_KEYS = {"init_from": None, "init_strict": True}

DEVICES = ("auto", "cpu", "cuda", "cuda:N")  # cuda:N: the CUDA device N
DETERMINISTIC = (True, False, "warn")
MATMUL_PRECISIONS = ("highest", "high", "medium")
ON_NONFINITE = ("stop", "skip")


@dataclass
class Config:
    # built through its _target_; init_from, init_strict: gearshift's, in every model node
    model: dict[str, Any] = field(default_factory=lambda: dict(MODEL_KEYS))
    data: dict[str, Any] = MISSING  # a source: its _target_ builds the datasets (data/sources.py)
    task: dict[str, Any] = MISSING  # a Task subclass through its _target_ (tasks/)
    dataloader: DataLoaderConfig = MISSING
    # a torch.optim.Optimizer class (_target_) and its keywords, beside the loop's own keys
    optimizer: dict[str, Any] = field(  # open: a preset's and `++` keywords join these keys
        default_factory=lambda: {f.name: f.default for f in fields(OptimizerConfig)}
    )
    # a torch.optim.lr_scheduler class (_target_) and its keywords; null: optimizer.schedule
    scheduler: dict[str, Any] = field(default_factory=lambda: {"_target_": None})
    amp: AmpConfig = MISSING
    memory_format: MemoryFormatConfig = MISSING
    compile: CompileConfig = MISSING
    logger: LoggerConfig = MISSING
    distributed: DistributedConfig = MISSING
    profile: ProfileConfig = MISSING
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    ema: EmaConfig = field(default_factory=EmaConfig)
    early_stop: EarlyStopConfig = field(default_factory=EarlyStopConfig)
    resume: str | None = "auto"  # the newest checkpoint in the run folder, if any; null; a path
    device_transforms: DeviceTransformsConfig = field(default_factory=DeviceTransformsConfig)
    batch_size_finder: BatchSizeFinderConfig = field(default_factory=BatchSizeFinderConfig)
    batch_size: Any = 64  # per device: an integer >= 1, or "auto" (batch_finder.py)
    accum: int = 1  # gradient accumulation: micro-batches per optimizer step (tip 13)
    epochs: int = 2  # passes over the training data
    max_steps: int | None = None  # when set, wins over epochs
    # task=lm: a budget in tokens, an integer >= 1 (1e9 too), rounded up to whole steps; wins
    # over epochs, and with max_steps the one that ends first wins (docs/language-models.md)
    max_tokens: Any = None
    warmup_steps: int = 5  # optimizer steps left out of the throughput figures
    seed: int = 0  # seeds every random stream and the data order
    device: str = "auto"  # DEVICES; auto: CUDA where present, else cpu
    log_every_n_steps: int = 10  # log steps: the loop reads the device only at these
    val_every_n_steps: int | None = None  # None: validate once, at the end
    cudnn_benchmark: bool = False  # cuDNN's autotuner (tip 15)
    deterministic: Any = False  # DETERMINISTIC; true: deterministic kernels only (runtime.py)
    matmul_precision: str = "highest"  # MATMUL_PRECISIONS; float32 matmuls; high: TF32 on CUDA
    progress_bar: bool = True  # the progress bar and the closing table
    advise: bool = False  # the gear advisor: its findings at start-up and in summary.json
    on_nonfinite: str = "stop"  # ON_NONFINITE, for a NaN/inf loss: exit 1, or skip its update
    trial: TrialConfig = field(default_factory=TrialConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    plan: PlanConfig = MISSING

    @staticmethod
    def check_node(cfg: DictConfig) -> None:
        """The keys at the config's top; `device` (checked last), max_tokens and
        model.init_from where set: feature_checks.py."""
        check_choice(cfg, "matmul_precision", MATMUL_PRECISIONS)
        check_switch(cfg, "deterministic", DETERMINISTIC)
        for key in ("accum", "epochs", "log_every_n_steps"):
            check_int(cfg, key, 1)
        value = cfg.batch_size
        if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            fail("batch_size", value, "expected an integer >= 1 or auto")
        check_int(cfg, "warmup_steps", 0)
        check_int(cfg, "max_steps", 1, optional=True)
        check_int(cfg, "val_every_n_steps", 1, optional=True)
        if cfg.resume not in (None, "auto") and not Path(cfg.resume).exists():
            allowed = "no such checkpoint file; give a checkpoint's path, auto or null"
            fail("resume", cfg.resume, allowed)
        strict = cfg.model.get("init_strict", True)
        if not isinstance(strict, bool):
            fail("model.init_strict", strict, "choose true or false")
        check_choice(cfg, "on_nonfinite", ON_NONFINITE)


ConfigStore.instance().store(name="gearshift_schema", node=Config)


def run_folder_name() -> str:
    """The run folder's name: its start time, or under torchrun its run id, which every rank
    and every restart of the job share (so a restart resumes from the same checkpoints)."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    if run_id != "none":
        return f"torchrun_{run_id}"
    return datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


OmegaConf.register_new_resolver("gearshift_run_folder", run_folder_name, use_cache=True)
