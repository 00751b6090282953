"""The Trainer: a plain PyTorch loop with each gear applied in one visible place.

`fit()` is the whole outer loop. `train_step()` is one micro-batch, and at the end of an
accumulation window one optimizer step; `evaluate()`, `save()` and `log()` are the other
seams a subclass may override (`trainer=mypackage.MyTrainer`). Everything a run learns
comes from its Task (tasks/), everything it reads from its data source (data/sources.py).
The tip numbers in comments are the rows of docs/gears.md.

The host waits for the device only at log steps (reading the summed loss); everything
else stays asynchronous.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from gearshift.batch_finder import resolve_batch_size
from gearshift.config.checks import locate
from gearshift.data.decode import UnreadableImage
from gearshift.data.device_transforms import DeviceTransforms, source_transforms
from gearshift.data.loading import build_batches, to_device
from gearshift.data.prefetch import prefetch_to_device
from gearshift.data.sources import build_datasets
from gearshift.engine.ema import build_ema
from gearshift.engine.failures import TrainingFailed
from gearshift.engine.optim import build_optimizer, build_schedule, clip_grad_norm
from gearshift.engine.precision import Precision, resolve_amp
from gearshift.engine.runtime import (
    configure_backends,
    configure_determinism,
    resolve_device,
    seed_everything,
)
from gearshift.models.blocks import model_blocks
from gearshift.models.build import build_model, maybe_compile
from gearshift.observe.advisor import advise, log_findings
from gearshift.observe.console import print_summary, progress_bar
from gearshift.observe.loggers import NullLogger, build_logger, write_json_atomic
from gearshift.observe.memory_snapshot import MemoryHistory, out_of_memory_message
from gearshift.observe.metrics import Interval, PerfMeter, memory_metrics, peak_memory
from gearshift.observe.mfu import MFU
from gearshift.observe.nonfinite import NONE, LossWatch
from gearshift.observe.profiler import Profiler
from gearshift.observe.summary import log_summary, make_summary, resolved_gears
from gearshift.observe.tokens import token_metrics, token_summary
from gearshift.parallel.distributed import (
    Ranks,
    destroy_process_group,
    gather_sum_max,
    grad_sync,
    init_process_group,
    rank_zero_value,
    ranks_from_environment,
    resolve_strategy,
    wrap_model,
)
from gearshift.state.best import build_tracker
from gearshift.state.checkpoint import (
    BEST,
    Position,
    best_as_checkpoint,
    changed_settings,
    find_resume,
    full_state,
    latest_checkpoint,
    load_checkpoint,
    restore_training_state,
    save_best,
    save_checkpoint,
    training_state,
)
from gearshift.state.preemption import StopRequest
from gearshift.tasks import build_task

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    summary: dict[str, Any]
    steady: Interval  # the steady-state steps behind the summary's figures


def fit(cfg: DictConfig, run_dir: Path, run_name: str | None = None) -> RunResult:
    """Train as `cfg` says; write summary.json, checkpoints and W&B into `run_dir` (rank 0)."""
    ranks = ranks_from_environment()
    strategy = resolve_strategy(cfg.distributed.strategy, ranks)  # 18
    device = resolve_device(cfg.device, ranks.local_rank)
    if not ranks.is_zero:  # rank 0 speaks for the job
        logging.getLogger("gearshift").setLevel(logging.WARNING)
    if strategy in ("ddp", "fsdp"):
        init_process_group(ranks, device, cfg.distributed)
        run_dir = Path(rank_zero_value(str(run_dir)))  # one run folder, rank 0's, for every rank
    try:
        trainer_class = locate("trainer", cfg.trainer)
        return trainer_class(cfg, run_dir, run_name, ranks, strategy, device).fit()
    finally:
        # The trainer is unreachable now, but in reference cycles: free its wrapped model (DDP's
        # reducer, FSDP's state) while the process group lives, not in the interpreter's
        # teardown, where gloo aborted now and then (SIGABRT after a finished run).
        gc.collect()
        destroy_process_group()


def timed(batches: Iterable, meter: PerfMeter) -> Iterator:
    """Yield from `batches`, telling `meter` how long the host waited for each one."""
    iterator = iter(batches)
    while True:
        start = time.perf_counter()
        batch = next(iterator, None)
        if batch is None:
            return
        meter.add_data_wait(time.perf_counter() - start)
        yield batch


class Trainer:
    def __init__(
        self,
        cfg: DictConfig,
        run_dir: Path,
        run_name: str | None,
        ranks: Ranks,
        strategy: str,
        device: torch.device,
    ) -> None:
        self.run_dir, self.run_name, self.ranks, self.strategy = run_dir, run_name, ranks, strategy
        self.device = device
        configure_determinism(cfg.deterministic)  # first: before CUDA starts (cuBLAS)
        if device.type == "cuda":  # this run's peak, not the process's (sweeps run in one process)
            torch.cuda.reset_peak_memory_stats(device)
        self.memory_history = MemoryHistory(
            cfg.profile.memory_snapshot, device, run_dir / "profile", ranks.rank
        )
        seed_everything(cfg.seed)
        configure_backends(  # 15, TF32
            device, cfg.cudnn_benchmark, cfg.matmul_precision, cfg.deterministic
        )
        amp = resolve_amp(cfg.amp.dtype, device)  # 11: against this machine (a CPU: measured)
        if device.type == "cpu" and strategy in ("ddp", "fsdp"):
            amp = rank_zero_value(amp)  # one dtype for all ranks, though their probes may differ
        self.precision = Precision(amp.dtype, device, amp.reason)
        channels_last = cfg.memory_format.channels_last  # 16
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.non_blocking = cfg.dataloader.non_blocking  # 7
        self.task = build_task(cfg.task)
        train_set, val_set = build_datasets(cfg.data, device)  # 1, 4, 6
        cfg, self.batch_choice = resolve_batch_size(  # 10
            cfg,
            self.task,
            device,
            self.precision.dtype,
            self.memory_format,
            len(train_set),
            run_dir,
        )
        self.cfg = cfg
        on_device = bool(cfg.data.get("on_device"))
        train, val = build_batches(  # 2, 3
            cfg, train_set, val_set, on_device, device, ranks.rank, ranks.world_size
        )
        self.train_batches = prefetch_to_device(train, cfg, device, self.memory_format)  # 7
        self.val_batches = prefetch_to_device(val, cfg, device, self.memory_format)
        self.transforms = DeviceTransforms(  # after the source's own (uint8 batches)
            cfg.device_transforms,
            device,
            self.memory_format,
            cfg.seed,
            source_transforms(train_set),
        )
        self.data_gears = getattr(train_set, "gears", {})  # how a disk source reads its images
        self.model = build_model(cfg.model, device, self.memory_format)  # + model.checkpointing
        self.model.train()
        self.ema = build_ema(cfg.ema, self.model)  # + weight averaging (None: off)
        self.advice = advise(cfg, self.model, device, self.precision.dtype)  # 9, 10, 15-18
        if ranks.is_zero:
            log_findings(self.advice)
        self.mfu = MFU.measure(
            self.model, self.task, cfg.matmul_precision, device, self.precision,
            self.memory_format, strategy,
        )  # fmt: skip
        compiled = maybe_compile(self.model, cfg.compile, device)  # 8
        blocks = model_blocks(self.model)  # FSDP's units
        self.forward = wrap_model(compiled, strategy, device, cfg.distributed, blocks)  # 18
        self.optimizer = build_optimizer(self.model, cfg.optimizer)
        self.batches_per_epoch = len(self.train_batches)
        self.total_steps = cfg.max_steps or cfg.epochs * math.ceil(
            self.batches_per_epoch / cfg.accum
        )
        self.schedule = build_schedule(self.optimizer, cfg.optimizer, self.total_steps)
        self.config = OmegaConf.to_container(cfg, resolve=True)
        self.checkpoints = run_dir / "checkpoints"
        self.sharded = strategy == "fsdp"  # checkpoints gather the shards; resuming scatters them
        self.best = build_tracker(self.task, cfg.early_stop)  # best.pt, early stopping
        if cfg.early_stop.patience is not None and self.val_batches is None and ranks.is_zero:
            log.warning("early_stop.patience: no validation data to judge by; it stays off")
        self.saved_step = self.validated_step = None  # the end saves and validates once
        self.best_saved_at: tuple[int, int, int] | None = None  # (step, epoch, batch)
        self.position = self.resume()
        self.transforms.start_at(self.position.epoch * self.batches_per_epoch + self.position.batch)
        # Plain values for the step: a DictConfig lookup costs microseconds, an attribute nothing.
        self.accum, self.set_to_none = cfg.accum, cfg.optimizer.set_to_none
        self.clip_grad_norm = cfg.optimizer.clip_grad_norm
        self.grad_norm: torch.Tensor | None = None  # the last one measured, on the device
        self.log_every, self.warmup_steps = cfg.log_every_n_steps, cfg.warmup_steps
        self.val_every = cfg.val_every_n_steps
        self.checkpoint_every, self.checkpoint_at_end = (
            cfg.checkpoint.every_n_steps,
            cfg.checkpoint.at_end,
        )
        self.meter = PerfMeter(device, cfg.warmup_steps)
        self.profiler = Profiler(cfg.profile, device, run_dir, cfg.warmup_steps, ranks.is_zero)
        self.meter.leave_out(self.profiler.window)  # the profiled steps run slower
        # each step's loss on the device, read at log steps; on_nonfinite acts on it
        self.losses = LossWatch(cfg.on_nonfinite, device, cfg.log_every_n_steps)
        self.window_samples = 0
        self.last_loss = float("nan")
        self.val: dict[str, float | None] = dict.fromkeys(self.task.metrics)
        self.ema_val: dict[str, float | None] = dict.fromkeys(self.task.metrics)
        self.stop_agreed = False  # several ranks stop together, deciding at a log step
        self.logger: NullLogger = NullLogger()

    # ------------------------------------------------------------------ the loop

    def fit(self) -> RunResult:
        if (finished := self.finished_summary()) is not None:
            return RunResult(self.model, self.optimizer, finished, Interval())
        if self.ranks.is_zero:
            self.logger = build_logger(
                self.cfg.logger, self.run_dir, self.config, self.run_name, self.position.step
            )
        self.progress = progress_bar(enabled=self.ranks.is_zero and self.cfg.progress_bar)
        p, summary = self.position, None
        self.gears = resolved_gears(self.cfg, self.precision, self.device, self.strategy)
        self.gears |= self.data_gears
        workers = f"{self.gears['num_workers']} ({self.gears['num_workers_reason']})"
        log.info("on this machine: amp -> %s; loader workers -> %s", self.precision.reason, workers)
        log.info(
            "%s on %s, %.2fM parameters, %d steps",
            type(self.model).__name__,
            self.device,
            sum(t.numel() for t in self.model.parameters()) / 1e6,
            self.total_steps,
        )
        try:
            with self.progress, StopRequest() as self.stop:
                self.bar = self.progress.add_task(
                    "train", total=self.total_steps, samples_per_sec=0.0, loss=float("nan")
                )
                self.progress.update(self.bar, completed=p.step)
                self.meter.resume()
                self.profiler.begin()
                while p.step < self.total_steps and not self.best.should_stop:
                    self.train_batches.set_epoch(p.epoch, p.batch)
                    for batch in timed(self.train_batches, self.meter):
                        if not self.train_step(batch):
                            continue  # accumulating: the optimizer steps once per window
                        self.profiler.after_step(p.step)
                        at_end = p.step == self.total_steps
                        if self.logs_at(p.step):
                            self.log(self.log_point())
                        if (self.val_every and p.step % self.val_every == 0) or at_end:
                            self.validate()  # before saving: a checkpoint holds its outcome
                        if self.stop_agreed if self.ranks.world_size > 1 else self.stop:
                            raise self.stop.stopped(p.step, self.save())
                        every = self.checkpoint_every
                        if (every and p.step % every == 0) or (at_end and self.checkpoint_at_end):
                            self.save()
                        if at_end or self.best.should_stop:
                            break
                    else:
                        p.epoch, p.batch = p.epoch + 1, 0
            if self.validated_step != p.step:  # a run resumed at its end
                self.validate()
            if self.best.should_stop and self.checkpoint_at_end and self.saved_step != p.step:
                self.save()  # early stopping ends with a checkpoint like any other end
            summary = self.summarize()
        except UnreadableImage as error:  # found mid-epoch: checkpoint, then one line naming it
            raise error.after(self.save_at_last_step()) from None
        except torch.OutOfMemoryError as error:
            raise TrainingFailed(self.out_of_memory(error)) from None
        finally:
            self.profiler.finish()  # a run cut short keeps the profiled steps it made
            self.memory_history.dump()
            self.memory_history.stop()
            self.logger.finish(summary)
        return RunResult(self.model, self.optimizer, summary, self.meter.steady_state())

    def train_step(self, batch: Any) -> bool:
        """One micro-batch forward and backward; at the end of its accumulation window one
        optimizer step (tip 13). Returns whether the optimizer stepped."""
        p = self.position
        first = p.batch - p.batch % self.accum
        last = min(first + self.accum, self.batches_per_epoch) - 1  # a short last window too
        inputs, targets = self.place(batch, train=True)
        with grad_sync(self.forward, enabled=p.batch == last):  # 13: one all-reduce per window
            with self.precision.autocast():  # 11
                loss = self.task.loss(self.forward, inputs, targets)
            if last > first:
                loss = loss / (last - first + 1)  # the window's gradients sum to its mean
            self.precision.backward(loss)
        self.losses.add(loss.detach(), p.step + 1)
        self.window_samples += self.task.count(inputs, targets)
        p.batch += 1
        if p.batch <= last:
            return False
        if self.losses.update_allowed():  # on_nonfinite=skip: False for a NaN/inf loss
            if self.clip_grad_norm is not None or self.logs_at(p.step + 1):  # else no norm needed
                self.precision.unscale(self.optimizer)  # fp16: clip and report the true gradients
                self.grad_norm = clip_grad_norm(self.model.parameters(), self.clip_grad_norm)
            self.precision.step(self.optimizer)
        elif self.ranks.is_zero:
            log.warning("step %d: non-finite loss, update skipped (on_nonfinite=skip)", p.step + 1)
        self.optimizer.zero_grad(set_to_none=self.set_to_none)  # 12
        if self.schedule is not None:
            self.schedule.step()
        p.step += 1
        if self.ema is not None:
            self.ema.update(p.step)  # on the device, no sync
        p.samples += self.window_samples
        self.meter.step(self.window_samples)
        self.window_samples = 0
        return True

    def logs_at(self, step: int) -> bool:
        """Whether the loop logs after optimizer step `step`."""
        return step % self.log_every == 0 or step in (self.warmup_steps, self.total_steps)

    def place(self, batch: Any, train: bool = False) -> tuple[Any, Any]:
        """The batch on the device in the model's layout (7, 16), normalised and augmented there."""
        inputs, targets = to_device(batch, self.device, self.non_blocking, self.memory_format)
        return self.transforms(inputs, train), targets

    @torch.inference_mode()  # 14: no autograd graph, no version counters
    def evaluate(self, model: nn.Module | None = None) -> dict[str, float]:
        """The task's validation metrics of `model` (default: the model trained) over every
        rank's share of the validation set."""
        model = self.model if model is None else model
        training = model.training
        model.eval()
        sums: dict[str, torch.Tensor] = {}
        count = 0
        for batch in self.val_batches:
            inputs, targets = self.place(batch)
            with self.precision.autocast():
                batch_sums = self.task.eval_sums(model, inputs, targets)
            for key, value in batch_sums.items():
                sums[key] = sums[key] + value if key in sums else value
            count += self.task.count(inputs, targets)
        model.train(training)
        keys = sorted(sums)
        local = torch.stack([sums[k].double() for k in keys]).tolist() if keys else []
        (*totals, count), _ = gather_sum_max([*local, count], [], self.device)
        return self.task.eval_metrics(dict(zip(keys, totals, strict=True)), int(count))

    def validate(self) -> None:
        """Validate the model (and its average), log it, and keep the best in best.pt."""
        if self.val_batches is None:
            return
        self.validated_step = step = self.position.step
        self.val.update(self.evaluate())
        metrics = {f"val/{key.removeprefix('val_')}": value for key, value in self.val.items()}
        judged = self.val
        if self.ema is not None:  # the average is what a run with it keeps: it is judged
            judged = self.ema_val
            judged.update(self.evaluate(self.ema.model))
            metrics |= {f"val_ema/{key.removeprefix('val_')}": v for key, v in judged.items()}
        self.log(metrics)
        if self.best.update(judged[self.best.metric], step):
            self.keep_best()
        elif self.best.should_stop and self.ranks.is_zero:
            log.info(
                "early stop at step %d: %s has not improved on %s (step %s) for %d validations",
                step, self.best.metric, self.best.value, self.best.step, self.best.bad_validations,
            )  # fmt: skip
        self.meter.resume()  # validation time is not training time

    def log(self, metrics: dict[str, float]) -> None:
        """Send metrics of the current step to the logger (rank 0's; others hold a null one)."""
        self.logger.log(metrics, step=self.position.step)

    def log_point(self) -> dict[str, float]:
        """The metrics of the interval since the last log step: the loop's one host sync."""
        extra = [] if self.grad_norm is None else [self.grad_norm]
        loss_total, first_bad, skipped, grad_norm = self.losses.read(extra)  # one read for all
        interval = self.meter.flush()
        peak_bytes, _ = peak_memory(self.device)
        world = self.ranks.world_size
        (loss_total, global_samples, stops), (peak_bytes, first_bad) = gather_sum_max(
            [loss_total, interval.samples, float(bool(self.stop))],
            [peak_bytes, -(NONE if first_bad is None else first_bad)],  # max of - = first
            self.device,
        )
        if first_bad > -NONE:
            raise TrainingFailed(self.nonfinite(int(-first_bad)))
        counted = (interval.steps - skipped) * world  # skipped steps' losses are left out
        self.last_loss = loss_total / counted if counted else float("nan")
        self.stop_agreed = stops > 0
        samples_per_sec = global_samples / interval.seconds
        metrics = {
            "train/loss": self.last_loss,
            "train/lr": self.optimizer.param_groups[0]["lr"],
            "perf/samples_per_sec": samples_per_sec,
            "perf/step_time_ms": interval.median_step_ms,
            "perf/data_wait_pct": interval.data_wait_pct,
            **self.mfu.metrics(samples_per_sec / world),
            **token_metrics(samples_per_sec, self.task.tokens_per_sample),
            "mem/peak_gib": peak_bytes / 2**30,
            **memory_metrics(self.device),
        }
        if grad_norm:  # this step's, before clipping; the same on every rank
            metrics["train/grad_norm"] = grad_norm[0]
        if self.precision.scaler.is_enabled():
            metrics["amp/grad_scale"] = self.precision.grad_scale()
            metrics["amp/skipped_steps"] = int(self.precision.skipped_steps)
        if self.losses.skip:  # on_nonfinite=skip: counted on the host as the steps are decided
            metrics["train/nonfinite_skipped_steps"] = self.losses.skipped
        self.progress.update(
            self.bar,
            completed=self.position.step,
            samples_per_sec=samples_per_sec,
            loss=self.last_loss,
        )
        self.progress.refresh()
        return metrics

    # ------------------------------------------------------------------ state

    def resume(self) -> Position:
        """Where training starts: the checkpoint resume=auto|PATH names, or the beginning."""
        path = find_resume(self.cfg.resume, self.checkpoints)
        if path is None:
            return Position()
        state = load_checkpoint(path)
        position = restore_training_state(
            state,
            path,
            self.model,
            self.optimizer,
            self.precision.scaler,
            self.schedule,
            self.sharded,
        )
        if "best" in state:
            self.best.load_state_dict(state["best"])
        if self.ema is not None:
            if "ema" not in state:
                log.warning("%s holds no weight average: it starts from the resumed weights", path)
            self.ema.load_state_dict(state.get("ema", self.model.state_dict()))
        changed = changed_settings(state["config"], self.config)  # a requeue changes none
        if changed and self.ranks.is_zero:  # rank 0 speaks for the job
            log.warning("resumed a run trained with other settings: %s", ", ".join(changed))
        return position

    def save(self) -> Path | None:
        """Checkpoint the run at its position; rank 0 writes (sharded: every rank gathers)."""
        p, keep = self.position, self.cfg.checkpoint.keep
        self.saved_step = p.step
        if self.best_saved_at == (p.step, p.epoch, p.batch):  # a validation just kept this state
            return (
                best_as_checkpoint(self.checkpoints, p.step, keep) if self.ranks.is_zero else None
            )
        state = self.checkpoint_state()
        if state is None:
            return None
        return save_checkpoint(state, self.checkpoints, p.step, keep)

    def keep_best(self) -> None:
        """The state at the best validation so far, over checkpoints/best.pt."""
        p = self.position
        if (state := self.checkpoint_state()) is not None:
            save_best(state, self.checkpoints)
        self.best_saved_at = (p.step, p.epoch, p.batch)  # on every rank: save() agrees

    def checkpoint_state(self) -> dict[str, Any] | None:
        """What a checkpoint holds (rank 0; None on the others). Every rank calls it: the
        weights are checked to be finite on all (and gathered, sharded)."""
        # never save poisoned weights: one read, agreed over ranks
        first_bad, finite = self.losses.check(self.model.parameters())
        _, (first_bad, unhealthy) = gather_sum_max(
            [], [-(NONE if first_bad is None else first_bad), float(not finite)], self.device
        )
        if first_bad > -NONE or unhealthy:
            raise TrainingFailed(self.nonfinite(int(-first_bad) if first_bad > -NONE else None))
        if not (self.ranks.is_zero or self.sharded):
            return None
        model_state, optimizer_state = full_state(self.model, self.optimizer, self.sharded)
        if not self.ranks.is_zero:
            return None
        p = self.position
        done_epoch = p.batch == self.batches_per_epoch  # the next batch opens the next epoch
        where = Position(p.step, p.epoch + done_epoch, 0 if done_epoch else p.batch, p.samples)
        state = training_state(
            self.config, model_state, optimizer_state, self.precision.scaler, self.schedule, where
        )
        state["best"] = self.best.state_dict()
        if self.ema is not None:
            state["ema"] = self.ema.state_dict()  # beside the weights, with the same keys
        return state

    def save_at_last_step(self) -> Path | None:
        """save() at the last optimizer step: a window cut short is redone on resume."""
        self.position.batch -= self.position.batch % self.accum
        return self.save()

    def nonfinite(self, step: int | None) -> str:
        """The line a NaN/inf loss (at `step`) or NaN/inf weights end the run with."""
        p = self.position
        what = (
            f"non-finite loss (NaN or inf) at step {step}"
            if step is not None
            else (f"non-finite weights at step {p.step} (the loss was finite)")
        )
        last = latest_checkpoint(self.checkpoints) if self.checkpoints.is_dir() else None
        kept = f"the last good checkpoint: {last}" if last else "no checkpoint was saved before it"
        return (
            f"{what}; stopped (on_nonfinite={self.cfg.on_nonfinite}), {kept}; "
            "try a lower optimizer.lr, or on_nonfinite=skip to skip such steps' updates"
        )

    def out_of_memory(self, error: torch.OutOfMemoryError) -> str:
        """The line an out-of-memory error ends the run with (the snapshot dumped first)."""
        snapshot = self.memory_history.dump()
        self.memory_history.stop()
        return out_of_memory_message(
            error,
            self.position.step + 1,
            self.cfg.batch_size,
            snapshot,
            amp=self.precision.dtype is not None,
            checkpointing=bool(self.cfg.model.get("checkpointing", False)),
            batch_size_auto=self.batch_choice is not None,
        )

    def finished_summary(self) -> dict[str, Any] | None:
        """A rerun of a finished run trains nothing and keeps its summary."""
        finished = self.run_dir / "summary.json"
        ended = self.position.step >= self.total_steps or self.best.should_stop
        if not ended or not finished.is_file():
            return None
        log.warning(
            "%s trained all %d steps already; nothing to do (resume=null trains it again)",
            self.run_dir,
            self.total_steps,
        )
        return json.loads(finished.read_text())

    def summarize(self) -> dict[str, Any]:
        """summary.json (rank 0 writes it), the log line and the closing table."""
        p, world = self.position, self.ranks.world_size
        summary = make_summary(
            self.meter, self.device, world, p.step, p.samples, self.last_loss, self.gears, self.val
        )
        summary |= {
            **self.mfu.summary(summary["samples_per_sec_per_device"]),
            **token_summary(summary, self.task.tokens_per_sample),
            "batch_size_finder": self.batch_choice.as_dict() if self.batch_choice else None,
            "advice": [finding.as_dict() for finding in self.advice],
            "stop_reason": "early_stop" if p.step < self.total_steps else "completed",
            "best": self.best.summary(f"checkpoints/{BEST}"),
            "ema": None if self.ema is None else {"decay": self.ema.decay, **self.ema_val},
            "profile": self.profiler.finish(),
            "nonfinite_skipped_steps": self.losses.skipped,
        }
        self.profiler.report(self.logger, p.step)
        if self.ranks.is_zero:
            write_json_atomic(self.run_dir / "summary.json", summary)
            log_summary(summary)
            if self.cfg.progress_bar:
                print_summary(summary)
        return summary
