"""What train.py's loop reports: the metrics of a log step (the loop's one read of the
device, reduced over the ranks in one collective) and the summary at the run's end."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from gearshift.build import Run, max_tokens_of
from gearshift.engine.failures import TrainingFailed
from gearshift.engine.optim import Optimizers
from gearshift.observe.loss_watch import NONE
from gearshift.observe.summary import run_environment, write_summary
from gearshift.observe.throughput import Interval, memory_metrics, peak_memory
from gearshift.parallel.distributed import gather_sum_max

if TYPE_CHECKING:
    from gearshift.observe.logger_backend import NullLogger
    from gearshift.validation import Validation


@dataclass
class RunResult:
    model: nn.Module
    optimizers: Optimizers
    summary: dict[str, Any]
    steady: Interval  # the steady-state steps behind the summary's figures


@dataclass
class LogPoint:
    metrics: dict[str, float]  # train/loss and the task's terms, lr, throughput, memory
    loss: float  # the mean training loss since the last log step, over every rank
    samples_per_sec: float  # the job's
    stop_agreed: bool  # some rank was asked to stop: every rank stops at this step


def read_log_point(run: Run, grad_norm: torch.Tensor | None, stop_requested: bool) -> LogPoint:
    """The metrics of the interval since the last log step. A NaN/inf loss on any rank
    since then ends the run here (TrainingFailed) under on_nonfinite=stop."""
    sums, first_bad, skipped, norm = run.losses.read([] if grad_norm is None else [grad_norm])
    interval = run.meter.flush()
    peak_bytes, _ = peak_memory(run.device)
    world = run.ranks.world_size
    (*totals, global_samples, stops), (peak_bytes, first_bad) = gather_sum_max(
        [*sums.values(), interval.samples, float(stop_requested)],  # the loss and its terms
        [peak_bytes, -(NONE if first_bad is None else first_bad)],  # max of - = first
        run.device,
    )
    if first_bad > -NONE:
        raise TrainingFailed(run.nonfinite(int(-first_bad)))
    counted = (interval.steps - skipped) * world  # skipped steps' losses are left out
    means = {  # train/loss, then the task's terms (none counted: NaN)
        f"train/{name}": total / counted if counted else math.nan
        for name, total in zip(sums, totals, strict=True)
    }
    samples_per_sec = global_samples / interval.seconds
    tokens: dict[str, float] = {}
    if run.task.tokens_per_sample is not None:  # task=lm: tokens/s beside samples/s
        from gearshift.observe.token_rates import token_metrics

        tokens = token_metrics(samples_per_sec, run.task.tokens_per_sample)
    metrics = {
        **means,
        "train/lr": run.optimizers.lr(),
        "perf/samples_per_sec": samples_per_sec,
        "perf/step_time_ms": interval.median_step_ms,  # this rank's
        "perf/data_wait_pct": interval.data_wait_pct,
        **run.mfu.metrics(samples_per_sec / world),
        **tokens,
        "mem/peak_gib": peak_bytes / 2**30,
        **memory_metrics(run.device),
    }
    if norm:  # this step's, before clipping; the same on every rank
        metrics["train/grad_norm"] = norm[0]
    metrics |= run.precision.metrics() | run.losses.metrics()  # fp16's; on_nonfinite=skip's
    return LogPoint(metrics, means["train/loss"], samples_per_sec, stops > 0)


def summarize(
    run: Run, run_dir: Path, last_loss: float, validation: Validation, logger: NullLogger
) -> dict[str, Any]:
    """summary.json's figures (docs/observing.md, "What a run leaves behind"), reduced over
    the ranks; rank 0 writes them into `run_dir` with the log line and the closing table."""
    p, world, steady = run.position, run.ranks.world_size, run.meter.steady_state()
    local_peak, peak_kind = peak_memory(run.device)
    before, since = p.samples_counted
    (steady_samples, job_samples), (seconds, peak_bytes) = gather_sum_max(
        [steady.samples, since], [steady.seconds, local_peak], run.device
    )
    samples_per_sec = steady_samples / seconds if seconds > 0 else 0.0
    summary = {
        "samples_per_sec": samples_per_sec,
        "samples_per_sec_per_device": samples_per_sec / world,
        "step_time_ms": steady.median_step_ms,
        "data_wait_pct": steady.data_wait_pct,
        "peak_memory_bytes": int(peak_bytes),
        "peak_memory_kind": peak_kind,
        "final_loss": last_loss,
        "steps": p.step,
        "samples": before + int(job_samples),
        "world_size": world,
        "device": str(run.device),
        "gears": dict(run.gears),
        "environment": run_environment(),
        **validation.values,
    }
    if run.task.tokens_per_sample is not None:  # task=lm: tokens beside samples
        from gearshift.observe.token_rates import token_summary

        summary |= token_summary(summary, run.task.tokens_per_sample)
    ema, choice = run.ema, run.batch_choice
    summary |= {  # the build's decisions and measures, then the loop's outcome
        **run.mfu.summary(summary["samples_per_sec_per_device"]),
        "max_tokens": max_tokens_of(run.cfg),
        "batch_size_finder": choice.as_dict() if choice else None,
        "advice": [finding.as_dict() for finding in run.advice],
        "plan": run.plan.summary(summary) if run.plan else None,
        "stop_reason": validation.stop_reason,
        "best": run.best.summary(run.checkpointer.best_path),
        "ema": None if ema is None else {"decay": ema.decay, **validation.ema_values},
        "profile": run.profiler.finish(),
        "nonfinite_skipped_steps": run.losses.skipped,
    }
    run.profiler.report(logger, p.step)
    if run.ranks.is_zero:
        write_summary(run_dir, summary, table=run.cfg.progress_bar)
    return summary
