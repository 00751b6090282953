"""The Trainer: the training loop, with each gear applied in one visible place.

`fit()` is the whole outer loop, one optimizer step at a time; `train_step()` is one
optimizer step with its accumulation window's micro-batches visible inside it. The run's
parts are built once, before the loop, by build.py; the seams a subclass may override
(`trainer=mypackage.MyTrainer`) are `train_step`, `forward_backward`, `evaluate`, `save`
and `log`. The host waits for the device only at log steps (reading the losses), at
validations and at checkpoints; everything else stays asynchronous.
"""

from __future__ import annotations

import gc
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from gearshift.build import build_run
from gearshift.config import DataError
from gearshift.config.rules import locate
from gearshift.engine.accumulation import Window
from gearshift.engine.failures import TrainingFailed
from gearshift.engine.optim import Optimizers, clip_grad_norm
from gearshift.engine.runtime import resolve_device
from gearshift.observe.console import ProgressBar
from gearshift.observe.loggers import NullLogger, build_logger
from gearshift.observe.loss_watch import NONE, nonfinite_message
from gearshift.observe.summary import finished_summary, make_summary, write_summary
from gearshift.observe.throughput import Interval, memory_metrics, peak_memory
from gearshift.observe.token_rates import token_metrics
from gearshift.parallel.distributed import (
    Ranks,
    destroy_process_group,
    gather_sum_max,
    grad_sync,
    init_process_group,
    rank_zero_value,
    ranks_from_environment,
    resolve_strategy,
)
from gearshift.state.preemption import StopRequest
from gearshift.tasks.metrics import ValidationFailed

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    model: nn.Module
    optimizers: Optimizers
    summary: dict[str, Any]
    steady: Interval  # the steady-state steps behind the summary's figures


def fit(cfg: DictConfig, run_dir: Path, run_name: str | None = None) -> RunResult:
    """Train as `cfg` says; write summary.json, checkpoints and W&B into `run_dir` (rank 0)."""
    ranks = ranks_from_environment()
    strategy = resolve_strategy(cfg.distributed.strategy, ranks)  # tip 18: DDP, not DP
    device = resolve_device(cfg.device, ranks.local_rank)
    if not ranks.is_zero:  # rank 0 speaks for the job
        logging.getLogger("gearshift").setLevel(logging.WARNING)
    trainer_class = locate("trainer", cfg.trainer)  # a Trainer subclass: config/schema.py
    if strategy in ("ddp", "fsdp"):
        init_process_group(ranks, device, cfg.distributed)
        run_dir = Path(rank_zero_value(str(run_dir)))  # one run folder, rank 0's, for every rank
    try:
        return trainer_class(cfg, run_dir, run_name, ranks, strategy, device).fit()
    finally:
        # The trainer is unreachable now, but in reference cycles: free its wrapped model (DDP's
        # reducer, FSDP's state) while the process group lives, not in the interpreter's
        # teardown, where gloo aborted now and then (SIGABRT after a finished run).
        gc.collect()
        destroy_process_group()


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
        """Every part comes from build_run (built once, restored when resuming); the loop
        keeps plain references to the ones it touches each step."""
        self.run_dir, self.run_name, self.ranks, self.device = run_dir, run_name, ranks, device
        self.run = run = build_run(cfg, run_dir, ranks, strategy, device)
        self.cfg, self.task, self.precision = run.cfg, run.task, run.precision
        self.model, self.forward, self.ema = run.model, run.forward, run.ema
        self.optimizers = run.optimizers
        self.train_batches, self.val_batches = run.train_batches, run.val_batches
        self.position, self.best, self.checkpointer = run.position, run.best, run.checkpointer
        self.meter, self.losses, self.profiler = run.meter, run.losses, run.profiler
        # Plain values for the step: a DictConfig lookup costs microseconds, an attribute nothing.
        cfg = self.cfg
        self.accum, self.set_to_none = cfg.accum, cfg.optimizer.set_to_none
        self.clip_grad_norm = cfg.optimizer.clip_grad_norm
        self.log_every, self.warmup_steps = cfg.log_every_n_steps, cfg.warmup_steps
        self.val_every, self.total_steps = cfg.val_every_n_steps, run.total_steps
        # a step budget (max_steps, or max_tokens in steps: build.py step_budget) wins over epochs
        self.max_steps = run.max_steps or math.inf
        self.epochs = math.inf if run.max_steps else cfg.epochs
        self.grad_norm: torch.Tensor | None = None  # the last one measured, on the device
        self.last_loss = float("nan")
        self.val: dict[str, float | None] = dict.fromkeys(self.task.metrics)
        self.ema_val: dict[str, float | None] = dict.fromkeys(self.task.metrics)
        self.validated_step: int | None = None  # the end validates once
        self.stop_agreed = False  # several ranks stop together, deciding at a log step
        self.pruned_at: int | None = None  # the step the study's pruner stopped this trial at
        self.logger: NullLogger = NullLogger()

    def fit(self) -> RunResult:
        p, run, summary = self.position, self.run, None
        if (done := finished_summary(self.run_dir, self.finished, self.total_steps)) is not None:
            return RunResult(self.model, self.optimizers, done, Interval())
        if self.ranks.is_zero:
            self.logger = build_logger(
                self.cfg.logger, self.run_dir, self.checkpointer.config, self.run_name, p.step
            )
        shown = self.ranks.is_zero and self.cfg.progress_bar
        self.progress = ProgressBar(shown, self.total_steps, completed=p.step)
        try:
            with self.progress, StopRequest.for_ranks(self.ranks.world_size) as self.stop:
                self.meter.resume()
                self.profiler.begin()
                for window in self.windows():
                    self.train_step(window)
                    self.profiler.after_step(p.step)
                    if self.logs_at(p.step):
                        self.log(self.log_point())
                    if (self.val_every and p.step % self.val_every == 0) or self.finished:
                        self.validate()  # before saving: a checkpoint holds its outcome
                    if self.stop_agreed if self.ranks.world_size > 1 else self.stop:
                        saved = self.save()
                        self.checkpointer.wait()  # checkpoint.async_save: written before we go
                        raise self.stop.stopped(p.step, saved)
                    if self.checkpointer.due(p.step, last=self.finished):
                        self.save()
            if self.validated_step != p.step:  # a run resumed at its end
                self.validate()
            self.checkpointer.wait()  # the last background write, before the summary
            summary = self.summarize()
        except DataError as error:  # found mid-epoch: checkpoint, then one line naming it
            saved = self.save_at_last_step()
            self.checkpointer.wait()
            raise error.after(saved) from None
        except (TrainingFailed, torch.OutOfMemoryError) as error:
            failed = error
            if isinstance(error, torch.OutOfMemoryError):
                failed = TrainingFailed(run.out_of_memory(error, p.step + 1))
            # a study's trial is marked failed now: a sweep killed before it notices the
            # end does not launch the trial again
            run.reporter.fail(str(failed))
            raise failed from None
        finally:
            self.checkpointer.close(quiet=summary is None)  # a write in flight still completes
            self.profiler.finish()  # a run cut short keeps the profiled steps it made
            if run.memory_history is not None:  # profile.memory_snapshot=true
                run.memory_history.dump()
                run.memory_history.stop()
            self.logger.finish(summary)
        return RunResult(self.model, self.optimizers, summary, self.meter.steady_state())

    def windows(self) -> Iterator[Window]:
        """The micro-batches of each optimizer step, epoch after epoch, until the last step
        or an early stop (tip 13: accumulation windows of `accum` batches; an epoch's last
        window may be shorter)."""
        p = self.position
        while not self.finished:
            self.train_batches.set_epoch(p.epoch, p.epoch_start)  # state/position.py
            p.epoch_batches = len(self.train_batches)  # this rank's, to the epoch's end
            batches = self.meter.timed(self.train_batches)  # the data wait of each batch
            while p.batch < p.epoch_batches and not self.finished:
                yield Window(batches, min(self.accum, p.epoch_batches - p.batch))
            if p.batch >= p.epoch_batches:
                p.next_epoch()

    @property
    def finished(self) -> bool:
        """The last step or epoch is done, or early stopping or the study's pruner ended the
        run. (Epochs count on their own: a resume with another batch size takes other steps.)"""
        p = self.position
        epochs = p.epoch + p.epoch_done
        stopped = self.best.should_stop or self.pruned_at is not None
        return p.step >= self.max_steps or epochs >= self.epochs or stopped

    def train_step(self, window: Window) -> None:
        """One optimizer step: forward and backward over the window's micro-batches, the
        gradients all-reduced once (on the last), clipped, then the update."""
        p, samples = self.position, 0
        for i, batch in enumerate(window):
            samples += self.forward_backward(batch, len(window), sync=i == len(window) - 1)
            p.batch += 1
            p.trained += p.global_batch
        if self.losses.update_allowed():  # on_nonfinite=skip: False for a NaN/inf loss
            if self.clip_grad_norm is not None or self.logs_at(p.step + 1):  # else no norm needed
                self.precision.unscale(self.optimizers)  # fp16: clip and report the true gradients
                self.grad_norm = clip_grad_norm(self.model.parameters(), self.clip_grad_norm)
            self.precision.step(self.optimizers)  # tip 11: fp16 through the GradScaler
        elif self.ranks.is_zero:
            log.warning("step %d: non-finite loss, update skipped (on_nonfinite=skip)", p.step + 1)
        self.optimizers.zero_grad(set_to_none=self.set_to_none)  # tip 12: set_to_none
        self.optimizers.step_schedules()
        p.step += 1
        if self.ema is not None:
            self.ema.update(p.step)  # on the device, no sync
        p.samples += samples
        self.meter.step(samples)

    def forward_backward(self, batch: Any, window: int, sync: bool) -> int:
        """One micro-batch of a `window` of them; its loss scaled so that the window's
        gradients sum to their mean (the task's logged terms alike, in `losses.add`).
        Returns the samples it held."""
        batch = self.run.place(batch, train=True)  # whole: every field reaches the task
        with grad_sync(self.forward, enabled=sync):  # tip 13: one all-reduce per window
            with self.precision.autocast():  # tip 11: mixed precision
                loss, terms = self.task.loss_terms(self.forward, batch)
            if window > 1:
                loss = loss / window
            self.precision.backward(loss)
        self.losses.add(loss.detach(), self.position.step + 1, terms, window)
        return self.task.count(batch)

    def logs_at(self, step: int) -> bool:
        """Whether the loop logs after optimizer step `step`."""
        return step % self.log_every == 0 or step in (self.warmup_steps, self.total_steps)

    def evaluate(self, model: nn.Module | None = None) -> dict[str, float]:
        """The task's validation metrics of `model` (default: the model trained) over every
        rank's share of the validation set."""
        return self.run.evaluate(self.model if model is None else model)

    def validate(self) -> None:
        """Validate the model (and its average), log it, and keep the best in best/."""
        if self.val_batches is None:
            return
        self.validated_step = step = self.position.step
        try:
            self.val.update(self.evaluate())
            if self.ema is not None:
                self.ema_val.update(self.evaluate(self.ema.model))
        except ValidationFailed as failed:  # the user's code: keep what trained, then one line
            raise TrainingFailed(self.validation_failed(failed, step)) from None
        metrics = {f"val/{key.removeprefix('val_')}": value for key, value in self.val.items()}
        judged = self.val
        if self.ema is not None:  # the average is what a run with it keeps: it is judged
            judged = self.ema_val
            metrics |= {f"val_ema/{key.removeprefix('val_')}": v for key, v in judged.items()}
        self.log(metrics)
        self.log_samples(step)
        if self.best.update(judged[self.best.metric], step):  # says so if it stops early
            self.checkpointer.save_best(self.position, check=self.check_finite)
        if self.run.reporter.report(step, judged[self.best.metric]):  # a study's pruner
            self.pruned_at = step  # `finished`: the loop saves, then summarizes
        self.meter.resume()  # validation time is not training time

    def validation_failed(self, failed: ValidationFailed, step: int) -> str:
        """Save the run, then the line a failure of the task's or a metric's code at the
        validation of `step` ends it with."""
        saved = self.save()
        self.checkpointer.wait()  # checkpoint.async_save: written before we go
        kept = f"checkpoint {saved} holds the weights" if saved else "no checkpoint was saved"
        return f"validation at step {step}: {failed}; {kept}"

    def log_samples(self, step: int) -> None:
        """task.sample_every: text samples of the trained model at this validation (rank 0
        draws and logs them; under FSDP every rank takes part in the forward passes)."""
        sampler = self.run.sampler
        if sampler is None or not sampler.due(step, last=self.finished):
            return
        if self.ranks.is_zero or self.run.strategy == "fsdp":
            texts = sampler.draw(self.model, self.precision, step)
            self.logger.log_text("samples", texts, step)  # other ranks hold a null logger

    def log(self, metrics: dict[str, float]) -> None:
        """Send metrics of the current step to the logger (rank 0's; others hold a null one)."""
        self.logger.log(metrics, step=self.position.step)

    def log_point(self) -> dict[str, float]:
        """The metrics of the interval since the last log step: the loop's one host sync."""
        extra = [] if self.grad_norm is None else [self.grad_norm]
        sums, first_bad, skipped, grad_norm = self.losses.read(extra)  # one read for all
        interval = self.meter.flush()
        peak_bytes, _ = peak_memory(self.device)
        world = self.ranks.world_size
        (*totals, global_samples, stops), (peak_bytes, first_bad) = gather_sum_max(
            [*sums.values(), interval.samples, float(bool(self.stop))],  # the loss and its terms
            [peak_bytes, -(NONE if first_bad is None else first_bad)],  # max of - = first
            self.device,
        )
        if first_bad > -NONE:
            raise TrainingFailed(self.nonfinite(int(-first_bad)))
        counted = (interval.steps - skipped) * world  # skipped steps' losses are left out
        means = self.losses.means(totals, counted)  # train/loss, then the task's terms
        self.last_loss = means["train/loss"]
        self.stop_agreed = stops > 0
        samples_per_sec = global_samples / interval.seconds
        metrics = {
            **means,
            "train/lr": self.optimizers.lr(),
            "perf/samples_per_sec": samples_per_sec,
            **interval.metrics(),
            **self.run.mfu.metrics(samples_per_sec / world),
            **token_metrics(samples_per_sec, self.task.tokens_per_sample),
            "mem/peak_gib": peak_bytes / 2**30,
            **memory_metrics(self.device),
        }
        if grad_norm:  # this step's, before clipping; the same on every rank
            metrics["train/grad_norm"] = grad_norm[0]
        metrics |= self.precision.metrics() | self.losses.metrics()  # fp16's; on_nonfinite=skip's
        self.progress.update(self.position.step, samples_per_sec, self.last_loss)
        return metrics

    # ------------------------------------------------------------------ state

    def save(self) -> Path | None:
        """Checkpoint the run at its position: every rank writes its shards (state/checkpointer.py)."""
        return self.checkpointer.save(self.position, check=self.check_finite)

    def check_finite(self) -> None:
        """Never save poisoned weights: the losses since the last log step and the weights."""
        first_bad, finite = self.losses.check(self.model.parameters())
        if first_bad is not None or not finite:
            raise TrainingFailed(self.nonfinite(first_bad))

    def save_at_last_step(self) -> Path | None:
        """save() at the last optimizer step: a window cut short is redone on resume."""
        self.position.batch -= self.position.batch % self.accum
        return self.save()

    def nonfinite(self, step: int | None) -> str:
        """The line a NaN/inf loss (at `step`) or NaN/inf weights end the run with."""
        return nonfinite_message(
            step, self.position.step, self.checkpointer.latest(), self.cfg.on_nonfinite
        )

    @property
    def stop_reason(self) -> str:
        pruned, early = self.pruned_at is not None, self.best.should_stop
        return "pruned" if pruned else "early_stop" if early else "completed"

    def summarize(self) -> dict[str, Any]:
        """summary.json (rank 0 writes it), the log line and the closing table."""
        p, run = self.position, self.run
        summary = make_summary(
            self.meter, self.device, self.ranks.world_size, p.step, p.samples_counted,
            self.last_loss, run.gears, self.val,
        )  # fmt: skip
        summary |= {
            **run.summary(summary),  # the build's: MFU, tokens/s, budget, batch size, advice
            "stop_reason": self.stop_reason,
            "best": self.best.summary(self.checkpointer.best_path),
            "ema": None if self.ema is None else {"decay": self.ema.decay, **self.ema_val},
            "profile": self.profiler.finish(),
            "nonfinite_skipped_steps": self.losses.skipped,
        }
        self.profiler.report(self.logger, p.step)
        if self.ranks.is_zero:
            write_summary(self.run_dir, summary, table=self.cfg.progress_bar)
        return summary
