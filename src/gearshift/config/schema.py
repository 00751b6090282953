"""The typed schema of a run's config.

The dataclasses are registered with Hydra's ConfigStore as `gearshift_schema`, the first
entry of conf/config.yaml's defaults, so a wrong type fails while Hydra composes the
config; `checks.py` then checks what types alone cannot express. A key with a fixed set of
values has it defined here, beside its field, and `checks.py` reads it from here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

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
SCHEDULES = ("constant", "cosine")


@dataclass
class OptimizerConfig:
    name: str = "sgd"  # OPTIMIZERS; set by the optimizer group
    # one's own torch.optim.Optimizer subclass (module.Name), built as
    # cls(parameter groups, lr=lr, weight_decay=weight_decay); it replaces `name`'s
    _target_: str | None = None
    lr: float = 0.05  # the peak learning rate (AdamW's under muon)
    momentum: float = 0.9  # SGD's momentum
    nesterov: bool = False  # SGD: Nesterov momentum
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW's two betas
    weight_decay: float = 5e-4  # decoupled for AdamW, L2 for SGD
    weight_decay_1d: bool = True  # false: biases and norm gains are not decayed (nanoGPT)
    foreach: bool | None = None  # None: torch's default
    fused: bool = False  # one fused kernel for the update
    set_to_none: bool = False  # zero_grad(set_to_none=True): free the gradients (tip 12)
    # SCHEDULES, or one's own function factor(step, total_steps) -> float (module.name):
    # the lr over the run's steps, after the warm-up, as a multiple of `lr`
    schedule: str = "cosine"
    lr_warmup_steps: int = 0  # linear warm-up of the lr over these steps
    clip_grad_norm: float | None = None  # > 0: the gradients' total L2 norm is clipped to it
    muon_lr: float = 0.02  # optimizer=muon: Muon's lr on the hidden matrices (lr: AdamW's)
    muon_momentum: float = 0.95  # optimizer=muon: Muon's momentum


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


# plan.device: the run's own device (auto), the CPU, or a GPU of observe/mfu.py's table
PLAN_DEVICES = (
    "auto", "cpu", "h200", "h200_nvl", "h100", "h100_nvl", "h100_pcie", "a100", "l40s", "l4",
    "a10", "v100", "t4",
)  # fmt: skip


@dataclass
class PlanConfig:
    """`plan=on`: the run's memory and step time, traced under fake tensors (observe/plan.py),
    printed without training; `plan.check=true` adds the plan beside the measured figures to
    summary.json."""

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
    this node for each trial it launches; a run of its own leaves it null. build.py builds
    `reporter` with the other keys, and the Trainer reports every validation to it."""

    reporter: str | None = None  # the reporter's class (module.Name); null: the run reports nowhere
    storage: str | None = None  # where the study lives: a journal file, or a database URL
    study: str | None = None  # the study's name
    number: int | None = None  # the trial's number (= its run folder under the sweep folder)


# The model node's keys that are the trainer's, not the model's arguments (models/factory.py):
# init_from: a checkpoint or a Hugging Face GPT-2 folder whose weights the model starts from;
# init_strict: false loads the tensors that fit and lists the rest.
MODEL_KEYS = {"init_from": None, "init_strict": True}

DEVICES = ("auto", "cpu", "cuda", "cuda:N")  # cuda:N: the CUDA device N
DETERMINISTIC = (True, False, "warn")
MATMUL_PRECISIONS = ("highest", "high", "medium")
ON_NONFINITE = ("stop", "skip")
TRAINER = "gearshift.trainer.Trainer"  # the class every `trainer=` names, or a subclass of it


@dataclass
class Config:
    # instantiated through its _target_; init_from and init_strict are the trainer's
    # (models/init.py), present in every model node, yours too
    model: dict[str, Any] = field(default_factory=lambda: dict(MODEL_KEYS))
    data: dict[str, Any] = MISSING  # a source: its _target_ builds the datasets (data/sources.py)
    task: dict[str, Any] = MISSING  # a Task subclass through its _target_ (tasks/)
    dataloader: DataLoaderConfig = MISSING
    optimizer: OptimizerConfig = MISSING
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
    # a budget in tokens (task=lm): an integer >= 1 (1e9 too); in steps of batch_size x
    # ranks x accum x block_size tokens, rounded up; wins over epochs (with max_steps: the
    # one that ends first)
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
    on_nonfinite: str = "stop"  # ON_NONFINITE, for a NaN/inf loss: exit 1, or skip its update
    trainer: str = TRAINER  # or a subclass of yours: mypackage.MyTrainer
    trial: TrialConfig = field(default_factory=TrialConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    plan: PlanConfig = MISSING


ConfigStore.instance().store(name="gearshift_schema", node=Config)


def run_folder_name() -> str:
    """The run folder's name: its start time, or under torchrun its run id, which every rank
    and every restart of the job share (so a restart resumes from the same checkpoints)."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    if run_id != "none":
        return f"torchrun_{run_id}"
    return datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


OmegaConf.register_new_resolver("gearshift_run_folder", run_folder_name, use_cache=True)
