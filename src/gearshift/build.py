"""Assemble a run once: every part it trains with, each with the decision that made it
(`build_parts`: what validating a model needs; `build_run`: the rest, and a checkpoint
restored into them). docs/architecture.md, "Components": each part, its builder and node,
its state and its gears."""

from __future__ import annotations

import contextlib
import gc
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from gearshift.config.schema import DistributedConfig
from gearshift.data.loading import build_batches, loader_settings, stream_position, to_device
from gearshift.data.sources import FieldReader, build_datasets, stream_length
from gearshift.data.transforms_off import Untransformed, build_transforms, describe_transforms
from gearshift.engine.failures import TrainingFailed
from gearshift.engine.optim import Optimizers, build_optimizers, in_a_presets_place, optimizer_label
from gearshift.engine.precision import Precision, amp_name, resolve_amp
from gearshift.engine.runtime import (
    configure_backends,
    configure_determinism,
    resolve_device,
    seed_everything,
)
from gearshift.models.blocks import model_blocks
from gearshift.models.factory import build_model, compile_model, memory_layout, resolve_compile
from gearshift.observe.loss_watch import LossWatch
from gearshift.observe.mfu import MFU
from gearshift.observe.throughput import PerfMeter
from gearshift.parallel.distributed import (
    Ranks,
    destroy_process_group,
    ranks_from_environment,
    resolve_strategy,
    wrap_model,
)
from gearshift.state.best import BestTracker, build_tracker
from gearshift.state.checkpointer import Checkpointer, Layout, ModelState, RngState, read_resume
from gearshift.state.position import Position
from gearshift.tasks import Task, build_task
from gearshift.tasks.metrics import check_metrics, describe, failing_as, is_scalar, task_name

if TYPE_CHECKING:  # the optional parts' modules load only where their feature is configured
    from gearshift.batch_finder import BatchSizeChoice
    from gearshift.data.device_transforms import DeviceTransforms
    from gearshift.engine.ema import EMA
    from gearshift.observe.findings import Finding
    from gearshift.observe.memory_snapshot import MemoryHistory
    from gearshift.observe.plan import PlanCheck
    from gearshift.observe.profiler import Profiler
    from gearshift.observe.samples import Sampler
    from gearshift.observe.trial import Reporter
    from gearshift.state.checkpoint_reads import Saved

log = logging.getLogger(__name__)


# What the run decided on this machine, by name, each choice with its `*_reason`: made once
# by the builder, read-only after; the config stays as composed. summary.json's `gears`, a
# checkpoint's `decisions`, which a resumed run repeats (docs/architecture.md, "Components").
Gears = MappingProxyType


@dataclass
class Parts:
    """What validating a model needs, as built for this machine."""

    cfg: DictConfig  # the run's config, as composed (its decisions: `gears`)
    device: torch.device
    ranks: Ranks
    precision: Precision
    memory_format: torch.memory_format
    task: Task
    read: FieldReader  # data.fields: the names the task's `split` reads dict samples by
    train_batches: Any  # iterables of batches, with set_epoch(epoch, batch) and len()
    val_batches: Any | None
    transforms: DeviceTransforms | Untransformed  # device_transforms=off: Untransformed
    model: nn.Module  # the plain model (never wrapped): what checkpoints hold
    ema: EMA | None
    batch_choice: BatchSizeChoice | None
    gears: Gears

    @property
    def batch_size(self) -> int:
        """Each rank's batch: the config's, or the one `batch_size=auto` found."""
        return self.gears["batch_size"]

    def place(self, batch: Any, train: bool = False) -> Any:
        """The batch, whole, on the device in the model's layout (tips 7 and 16:
        non_blocking, channels_last), its images normalised and augmented there."""
        non_blocking = self.gears["non_blocking"]  # a DictConfig lookup costs microseconds a batch
        batch = to_device(batch, self.device, non_blocking, self.memory_format)
        return self.transforms.on_batch(batch, train)

    @torch.inference_mode()  # tip 14: no autograd graph, no version counters
    def validation_metrics(self, model: nn.Module) -> dict[str, float]:
        """The task's validation metrics of `model` over every rank's share of the
        validation set: each metric updated on the device batch by batch, then computed
        (synced over the ranks) and read once. User code that raises: ValidationFailed."""
        task, metrics = self.task, self.task.validation
        for metric in metrics.values():
            metric.to(self.device).reset()
        training = model.training
        model.eval()
        for batch in self.val_batches:
            batch = self.place(batch)
            with (
                self.precision.autocast(),
                failing_as(f"task._target_={task_name(task)!r}: eval_step"),
            ):
                predictions, targets = task.eval_step(model, batch)
            for name, metric in metrics.items():
                with failing_as(self.metric_name(name)):
                    metric.update(predictions, targets)
        model.train(training)
        values = []
        for name, metric in metrics.items():
            with failing_as(self.metric_name(name)):
                value = metric.compute()
                if not is_scalar(value):  # the start's check saw one number: it changed
                    raise ValueError(f"it computed {describe(value)}, expected one number")
            values.append(torch.as_tensor(value, dtype=torch.float64, device=self.device))
        read = torch.stack([v.reshape(()) for v in values]).tolist() if values else []  # one read
        return {f"val_{name}": value for name, value in zip(metrics, read, strict=True)}

    def metric_name(self, name: str) -> str:
        """How the line a metric's failure ends the run with names it."""
        added = self.cfg.task.get("metrics") or {}
        return f"task.metrics.{name}" if name in added else f"the task's metric {name!r}"


class ProfilerOff:
    """profile=off: the loop's calls to the profiler, which do nothing (so a run that does
    not profile does not load observe/profiler.py)."""

    def begin(self) -> None:
        pass

    def after_step(self, step: int) -> None:
        pass

    def finish(self) -> None:
        return None  # summary.json's `profile`: none

    def report(self, logger: Any, step: int) -> None:
        pass


class NoReporter:
    """A run that is no study's trial: nothing to report to, never pruned (so it does not
    load observe/trial.py)."""

    def report(self, step: int, value: float | None) -> bool:
        return False

    def fail(self, reason: str) -> None:
        pass


@dataclass
class Run(Parts):
    """Everything a training run needs, built and (when resuming) restored."""

    strategy: str
    forward: nn.Module  # the model as the loop calls it: compiled, wrapped for DDP/FSDP
    optimizers: Optimizers  # with their lr schedules
    max_steps: int | None  # the step budget (max_steps, max_tokens); None: epochs decide
    total_steps: int
    position: Position
    checkpointer: Checkpointer
    best: BestTracker
    mfu: MFU
    advice: list[Finding]  # advise=true: the advisor's findings (empty otherwise)
    meter: PerfMeter
    losses: LossWatch
    profiler: Profiler | ProfilerOff
    memory_history: MemoryHistory | None  # profile.memory_snapshot=true (None: off)
    reporter: Reporter  # a trial of a study: each validation told to it, which may prune the run
    sampler: Sampler | None  # task.sample_every: text samples at validations (None: off)
    plan: PlanCheck | None  # plan.check=true: the plan, held against what the run measures

    def save(self) -> Path | None:
        """Checkpoint the run at its position: every rank writes its shards (state/checkpointer.py)."""
        return self.checkpointer.save(self.position, check=self.check_finite)

    def save_at_last_step(self) -> Path | None:
        """save() at the last optimizer step: a window cut short is redone on resume."""
        self.position.batch -= self.position.batch % self.cfg.accum
        return self.save()

    def check_finite(self) -> None:
        """Never save poisoned weights: the losses since the last log step and the weights."""
        first_bad, finite = self.losses.check(self.model.parameters())
        if first_bad is not None or not finite:
            raise TrainingFailed(self.nonfinite(first_bad))

    def nonfinite(self, step: int | None) -> str:
        """The line a NaN/inf loss (at `step`) or NaN/inf weights end the run with."""
        from gearshift.observe.nonfinite import nonfinite_message  # only then

        return nonfinite_message(
            step, self.position.step, self.checkpointer.latest(), self.cfg.on_nonfinite
        )

    def close(self, quiet: bool) -> None:
        """At the run's end, finished or not: a checkpoint write in flight completes (`quiet`:
        without its log line), a run cut short keeps the steps it profiled, and
        profile.memory_snapshot's history is written."""
        self.checkpointer.close(quiet=quiet)
        self.profiler.finish()
        if self.memory_history is not None:
            self.memory_history.dump()
            self.memory_history.stop()

    def out_of_memory(self, error: torch.OutOfMemoryError, step: int) -> str:
        """The line an out-of-memory error at `step` ends the run with (memory_snapshot.py)."""
        from gearshift.observe.memory_snapshot import out_of_memory_message

        return out_of_memory_message(
            error, step, self.batch_size, self.memory_history,
            amp=self.precision.dtype is not None, checkpointing=self.gears["checkpointing"],
            batch_size_auto=self.batch_choice is not None,
        )  # fmt: skip


@dataclass(frozen=True)
class Job:
    """This process's place in the training job."""

    ranks: Ranks
    strategy: str  # none, ddp, fsdp (dp wraps in one process)
    device: torch.device
    run_dir: Path  # rank 0's run folder, on every rank


@contextlib.contextmanager
def distributed_job(cfg: DistributedConfig, device_name: str, run_dir: Path) -> Iterator[Job]:
    """While inside: this process's rank, strategy and device, and under DDP and FSDP the
    process group (tip 18: one process per device, not DataParallel's threads)."""
    ranks = ranks_from_environment()
    strategy = resolve_strategy(cfg.strategy, ranks)
    device = resolve_device(device_name, ranks.local_rank)
    if not ranks.is_zero:  # rank 0 speaks for the job
        logging.getLogger("gearshift").setLevel(logging.WARNING)
    if strategy in ("ddp", "fsdp"):  # several ranks only
        from gearshift.parallel.process_group import init_process_group, rank_zero_value

        init_process_group(ranks, device, cfg)
        run_dir = Path(rank_zero_value(str(run_dir)))  # one run folder, rank 0's, for every rank
    try:
        yield Job(ranks, strategy, device, run_dir)
    finally:
        # The run is unreachable now, but in reference cycles: free its wrapped model (DDP's
        # reducer, FSDP's state) while the process group lives, not in the interpreter's
        # teardown, where gloo aborted now and then (SIGABRT after a finished run).
        gc.collect()
        destroy_process_group()


def build_parts(
    cfg: DictConfig, ranks: Ranks, strategy: str, device: torch.device, saved: Saved | None = None
) -> Parts:
    """Precision, task, data, device transforms, the model and its average. `saved`: the
    checkpoint a resumed run continues, whose decisions it repeats."""
    configure_determinism(cfg.deterministic)  # before the first CUDA matmul (cuBLAS)
    seed_everything(cfg.seed)
    cudnn_benchmark = configure_backends(  # tip 15: cuDNN autotuner; TF32
        device, cfg.cudnn_benchmark, cfg.matmul_precision, cfg.deterministic
    )
    precision = build_precision(cfg, device, strategy, saved)
    channels_last = cfg.memory_format.channels_last  # tip 16: channels_last
    memory_format = memory_layout(channels_last)
    task = build_task(cfg.task)
    read = FieldReader(task, cfg.data.get("fields"))  # dict samples: the fields `split` reads
    train_set, val_set = build_datasets(cfg.data, device, read.names())  # tips 1, 4, 6
    read.check(train_set, cfg.task)  # unreadable samples, inputs of another shape: one line
    batch_choice = None
    if cfg.batch_size == "auto":  # tip 10: batch_size=auto fills the memory
        from gearshift.batch_finder import resolve_batch_size
        from gearshift.run_plan import planner  # on CUDA, the plan's guess first
        from gearshift.state.resumed import resumed_batch_size

        batch_choice = resolve_batch_size(
            cfg.batch_size_finder, cfg.model, cfg.optimizer, task, device, precision.dtype,
            memory_format, stream_length(train_set), resumed_batch_size(saved),
            planner(cfg, task),
        )  # fmt: skip
    batch_size = batch_choice.batch_size if batch_choice else cfg.batch_size
    train, val, data_gears = build_data(
        cfg, batch_size, train_set, val_set, device, ranks, memory_format
    )
    transforms = build_transforms(  # after the source's own (uint8 batches)
        cfg.device_transforms, device, memory_format, cfg.seed, train_set
    )
    model = build_model(cfg.model, device, memory_format)  # + model.checkpointing
    init_from = cfg.model.get("init_from")
    if init_from and saved is None:  # a resumed run continues its own weights
        from gearshift.state.init_from import init_weights

        init_weights(model, init_from, cfg.model.get("init_strict", True))
    model.train()
    gears = Gears({
        "amp": amp_name(precision.dtype),
        "amp_reason": precision.reason,
        "grad_scaler": precision.scaler.is_enabled(),
        "accum": cfg.accum,
        "batch_size": batch_size,
        "memory_format": "channels_last" if channels_last else "contiguous",
        **data_gears,
        "device_transforms": describe_transforms(cfg.device_transforms),
        "checkpointing": bool(cfg.model.get("checkpointing", False)),
        "cudnn_benchmark": cudnn_benchmark,
        "deterministic": cfg.deterministic,
        "matmul_precision": cfg.matmul_precision,
        **getattr(train_set, "gears", {}),  # how a disk source reads its images
    })  # fmt: skip
    if val is not None:  # a metric that cannot give one number: one line, before any work
        check_validation(cfg, task, model, device, precision, memory_format)
    ema = None
    if cfg.ema.decay is not None:  # weight averaging (ema.decay; null: off)
        from gearshift.engine.ema import build_ema

        ema = build_ema(cfg.ema, model)
    return Parts(
        cfg, device, ranks, precision, memory_format, task, read, train, val, transforms, model, ema,
        batch_choice, gears,
    )  # fmt: skip


def check_validation(
    cfg: DictConfig, task: Task, model: nn.Module, device: torch.device, precision: Precision,
    memory_format: torch.memory_format,
) -> None:  # fmt: skip
    """The task's validation of its example batch: its eval_step and each metric, with the
    random streams left as they were (a resumed run draws as it would have); then the
    metrics' own checks of each batch off."""
    added = cfg.task.get("metrics") or {}
    configured = {name: added[name].get("_target_") for name in added}
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        batch = to_device(task.example_batch(2, device), device, False, memory_format)
        check_metrics(task, model, batch, precision.autocast, configured)
    if added:  # checked: no per-batch checks (syncs)
        from gearshift.tasks.added_metrics import stop_checking_arguments

        stop_checking_arguments(task.validation, added)


def build_precision(
    cfg: DictConfig, device: torch.device, strategy: str, saved: Saved | None
) -> Precision:
    """Tip 11, mixed precision: the autocast dtype against this machine (on a CPU,
    measured). A resumed run of `amp=on` keeps the dtype its start resolved to."""
    amp = None
    if saved is not None:
        from gearshift.state.resumed import resolve_amp_on_resume

        amp = resolve_amp_on_resume(cfg.amp.dtype, saved)
    if amp is None:
        amp = resolve_amp(cfg.amp.dtype, device)
        if device.type == "cpu" and strategy in ("ddp", "fsdp"):
            from gearshift.parallel.process_group import rank_zero_value  # several ranks only

            amp = rank_zero_value(amp)  # one dtype for all ranks, though their probes may differ
    return Precision(amp.dtype, device, amp.reason)


def build_data(
    cfg: DictConfig,
    batch_size: int,
    train_set: Any,
    val_set: Any | None,
    device: torch.device,
    ranks: Ranks,
    memory_format: torch.memory_format,
) -> tuple[Any, Any | None, dict[str, Any]]:
    """This rank's training and validation batches with the data gears applied (tips 2, 3,
    7: workers, pinned memory, copies ahead of the compute), and those gears."""
    dl, on_device = cfg.dataloader, bool(cfg.data.get("on_device"))
    settings = loader_settings(dl, device, on_device)
    train, val = build_batches(
        cfg.data, dl, train_set, val_set, device, batch_size, cfg.seed, cfg.max_steps,
        memory_format, ranks.rank, ranks.world_size, settings,
    )  # fmt: skip
    prefetch = False
    if device.type == "cuda":  # the prefetcher acts on CUDA only
        from gearshift.data.prefetch import CudaPrefetcher, prefetch_active

        prefetch = prefetch_active(dl, on_device, device)
    if prefetch:  # tip 7: the next batch's copy on a side stream
        train = CudaPrefetcher(train, device, memory_format)
        val = None if val is None else CudaPrefetcher(val, device, memory_format)
    gears = {
        "data_on_device": on_device,
        "data_decode": cfg.data.get("decode", "host"),  # gpu: JPEGs decoded on the device
        "num_workers": settings.num_workers,
        "num_workers_reason": settings.num_workers_reason,
        "pin_memory": settings.pin_memory,
        "non_blocking": dl.non_blocking,
        "prefetch_to_device": prefetch,
    }
    return train, val, gears


def max_tokens_of(cfg: DictConfig) -> int | None:
    """`max_tokens` as an integer (the command line may write it 5e6), or None."""
    value = cfg.get("max_tokens")
    return None if value is None else int(value)


def build_run(
    cfg: DictConfig, run_dir: Path, ranks: Ranks, strategy: str, device: torch.device,
    make_optimizers: Callable[..., Optimizers] | None = None,
) -> Run:  # fmt: skip
    """Every part of a training run, restored from its checkpoint when it resumes.
    `make_optimizers(model, cfg.optimizer, total_steps, fsdp=, scheduler=)` builds the
    optimizers the checkpoint holds: a step of one's own passes its own from train.py (a
    GAN's two: docs/make-it-yours.md); None: the optimizer node's (build_optimizers)."""
    if device.type == "cuda":  # this run's peak, not the process's (sweeps run in one process)
        torch.cuda.reset_peak_memory_stats(device)
    memory_history = None
    if cfg.profile.memory_snapshot:  # first: it records the allocations that follow
        from gearshift.observe.memory_snapshot import MemoryHistory

        memory_history = MemoryHistory(True, device, run_dir / "profile", ranks.rank)
    folder = run_dir / "checkpoints"
    saved = read_resume(cfg.resume, folder)  # read once per start
    parts = build_parts(cfg, ranks, strategy, device, saved)
    cfg, model = parts.cfg, parts.model
    per_step = parts.batch_size * ranks.world_size * cfg.accum  # samples an optimizer step takes
    batches_per_epoch = len(parts.train_batches)
    max_steps = cfg.max_steps or None  # the step budget; None: the epochs decide
    epochs_steps = cfg.epochs * math.ceil(batches_per_epoch / cfg.accum)  # a fresh run's
    total_steps = max_steps or epochs_steps  # the last step: the schedules' length
    if saved is not None or max_tokens_of(cfg) is not None:  # counted before any work
        from gearshift.state.budget import Trained, run_length

        max_steps, total_steps = run_length(
            cfg.max_steps, max_tokens_of(cfg), epochs_steps, parts.task, per_step,
            Trained.of(saved), ranks.is_zero,
        )  # fmt: skip
    sampler = None
    sampling = getattr(parts.task, "sampling", None)  # task.sample_every (LM): text samples
    if sampling is not None:
        from gearshift.observe.samples import build_sampler

        sampler = build_sampler(  # a bad prompt too
            sampling, cfg.data, model, cfg.val_every_n_steps, cfg.seed
        )
    plan = None
    if cfg.plan.check:  # plan.check=true: the plan, before the run allocates
        from gearshift.run_plan import check_plan

        plan = check_plan(
            cfg, parts.batch_size, parts.task, device, parts.precision.dtype,
            parts.memory_format, ranks,
        )  # fmt: skip
    advice = []
    if cfg.advise:  # advise=true: the gear advisor's findings, logged once, in summary.json
        from gearshift.config_advice import advise_config
        from gearshift.observe.findings import log_findings

        advice = advise_config(cfg, model, device, parts.precision.dtype, parts.batch_size)
        if ranks.is_zero:
            log_findings(advice)
    mfu = MFU.measure(
        model, parts.task, cfg.matmul_precision, device, parts.precision, parts.memory_format,
        strategy,
    )  # fmt: skip
    compiled, compile_reason = resolve_compile(cfg.compile.enabled, device)
    forward = compile_model(model, cfg.compile) if compiled else model  # tip 8: torch.compile
    # tip 18: DDP (or FSDP, one unit per block)
    forward = wrap_model(forward, strategy, device, cfg.distributed, model_blocks(model))
    gears = Gears({  # beyond build_parts': torch.compile, the optimizer's, the strategy
        **parts.gears,
        "compile": cfg.compile.mode if compiled else "off",
        "compile_reason": compile_reason,
        "optimizer": optimizer_label(cfg.optimizer),  # or the class named in its place
        "fused": cfg.optimizer.fused,
        "foreach": cfg.optimizer.foreach,
        "set_to_none": cfg.optimizer.set_to_none,
        "distributed": strategy,
    })  # fmt: skip
    optimizers = (make_optimizers or build_optimizers)(
        model, cfg.optimizer, total_steps, fsdp=strategy == "fsdp", scheduler=cfg.scheduler
    )
    if ranks.is_zero and (in_place := in_a_presets_place(cfg.optimizer)):
        log.info(in_place)  # once, here: the batch finder's and the plan's builds say nothing
    best = build_tracker(parts.task, cfg.early_stop)  # best/, early stopping
    if cfg.early_stop.patience is not None and parts.val_batches is None and ranks.is_zero:
        log.warning("early_stop.patience: no validation data to judge by; it stays off")
    position = Position(global_batch=parts.batch_size * ranks.world_size)
    position.stream = stream_position(parts.train_batches)  # iterable data: its own state
    checkpointer = build_checkpointer(
        folder, parts, gears, strategy, position, optimizers, best, saved, batches_per_epoch
    )  # fmt: skip
    reporter: Reporter = NoReporter()
    if cfg.trial.reporter is not None:  # the `trial` node: set by the sweeper
        from gearshift.observe.trial import build_reporter

        reporter = build_reporter(cfg.trial, ranks)
    if cfg.profile.enabled:  # profile=on
        from gearshift.observe.profiler import ProfiledMeter, Profiler

        profiler = Profiler(cfg.profile, device, run_dir, cfg.warmup_steps, ranks.is_zero)
        meter = ProfiledMeter(device, cfg.warmup_steps, profiler.window)  # they run slower
    else:
        profiler, meter = ProfilerOff(), PerfMeter(device, cfg.warmup_steps)
    # each step's loss on the device, read at log steps; on_nonfinite acts on it
    if cfg.on_nonfinite == "skip":  # a NaN/inf step's update skipped
        from gearshift.observe.loss_skip import SkippingLossWatch

        losses = SkippingLossWatch(device, cfg.log_every_n_steps)
    else:
        losses = LossWatch(device, cfg.log_every_n_steps)
    log.info(
        "on this machine: amp -> %s; loader workers -> %d (%s)",
        parts.precision.reason, parts.gears["num_workers"], parts.gears["num_workers_reason"],
    )  # fmt: skip
    parameters = sum(t.numel() for t in model.parameters()) / 1e6
    log.info("%s on %s, %.2fM parameters, %d steps", type(model).__name__, device, parameters, total_steps)  # fmt: skip
    return Run(
        **vars(parts) | {"gears": gears},
        strategy=strategy, forward=forward, optimizers=optimizers,
        max_steps=max_steps, total_steps=total_steps, position=position, checkpointer=checkpointer, best=best,
        mfu=mfu, advice=advice, meter=meter, losses=losses, profiler=profiler,
        memory_history=memory_history, reporter=reporter, sampler=sampler, plan=plan,
    )  # fmt: skip


def build_checkpointer(
    folder: Path, parts: Parts, gears: Gears, strategy: str, position: Position,
    optimizers: Optimizers, best: BestTracker, saved: Saved | None, batches_per_epoch: int,
) -> Checkpointer:  # fmt: skip
    """The checkpointer of the run's parts, each registered under its name, beside the
    config as composed and the run's decisions (`gears`); restored from `saved` when the run
    resumes (and the device transforms' draws moved on to match)."""
    cfg, ranks, model = parts.cfg, parts.ranks, parts.model
    fsdp = strategy == "fsdp"  # each rank saves and loads its own shards (DCP)
    config = OmegaConf.to_container(cfg, resolve=True)
    layout = Layout(ranks.world_size, strategy, position.global_batch)
    checkpointer = Checkpointer(folder, ranks, config, dict(gears), cfg.checkpoint, layout)
    for name, part in {
        "position": position,
        "model": ModelState(model, fsdp),
        "optimizer": optimizers,  # with the schedules
        "scaler": parts.precision.scaler,
        "rng": RngState(),
        "best": best,
        "ema": parts.ema,
    }.items():
        checkpointer.register(name, part)
    if saved is not None:
        from gearshift.state.resumed import resume  # a resumed run only

        resume(checkpointer, saved, position, parts.transforms, batches_per_epoch)
    return checkpointer
