"""The training loop: a plain PyTorch loop with each gear applied in one place.

The numbers in the comments are the performance tips each gear follows. The host waits for
the device only at log steps (reading the loss); everything else stays asynchronous.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import nn

from gearshift.advisor import advise, log_findings
from gearshift.batch_finder import resolve_batch_size
from gearshift.checkpoint import (
    Position,
    changed_settings,
    find_resume,
    full_state,
    load_checkpoint,
    restore_training_state,
    save_checkpoint,
    training_state,
)
from gearshift.console import print_summary, progress_bar
from gearshift.data import build_data, loader_workers, resolve_pin_memory, to_device
from gearshift.device_transforms import DeviceTransforms
from gearshift.distributed import (
    destroy_process_group,
    gather_sum_max,
    grad_sync,
    init_process_group,
    rank_zero_value,
    ranks_from_environment,
    resolve_strategy,
    wrap_model,
)
from gearshift.loggers import NullLogger, build_logger, write_json_atomic
from gearshift.metrics import Interval, PerfMeter, memory_metrics, peak_memory
from gearshift.mfu import MFU
from gearshift.models import build_model, maybe_compile
from gearshift.optim import build_optimizer, build_schedule
from gearshift.precision import Precision, resolve_amp
from gearshift.preemption import StopRequest
from gearshift.prefetch import prefetch_active, prefetch_to_device
from gearshift.runtime import configure_backends, resolve_device, seed_everything

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    summary: dict[str, Any]
    steady: Interval  # the steady-state steps behind the summary's figures


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


@torch.inference_mode()  # tip 14: no autograd graph, no version counters
def evaluate(model: nn.Module, batches: Iterable, place, precision: Precision) -> dict[str, float]:
    """Loss and accuracy over every rank's share of the validation set."""
    model.eval()
    device = next(model.parameters()).device
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    count = 0
    for batch in batches:
        images, labels = place(batch)
        with precision.autocast():
            logits = model(images)
        loss_sum += F.cross_entropy(logits.float(), labels, reduction="sum")
        correct += (logits.argmax(dim=1) == labels).sum()
        count += labels.shape[0]
    model.train()
    (loss, right, seen), _ = gather_sum_max([loss_sum.item(), correct.item(), count], [], device)
    return {"val_loss": loss / seen, "val_accuracy": right / seen}


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
        return _fit(cfg, run_dir, run_name, ranks, strategy, device)
    finally:
        destroy_process_group()


def _fit(
    cfg: DictConfig, run_dir: Path, run_name: str | None, ranks, strategy, device
) -> RunResult:
    if device.type == "cuda":  # this run's peak, not the process's (sweeps run in one process)
        torch.cuda.reset_peak_memory_stats(device)
    seed_everything(cfg.seed)
    configure_backends(device, cfg.cudnn_benchmark, cfg.matmul_precision)  # 15, TF32
    amp = resolve_amp(cfg.amp.dtype, device)  # 11: against this machine (a CPU: measured)
    if device.type == "cpu" and strategy in ("ddp", "fsdp"):
        amp = rank_zero_value(amp)  # one dtype for all ranks, though their probes may differ
    precision = Precision(amp.dtype, device, amp.reason)
    channels_last = cfg.memory_format.channels_last  # 16
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    non_blocking = cfg.dataloader.non_blocking  # 7
    cfg, batch_choice = resolve_batch_size(cfg, device, precision.dtype, memory_format, run_dir)
    transforms = DeviceTransforms(cfg.device_transforms, device, memory_format, cfg.seed)

    def place(batch, train: bool = False):
        images, labels = to_device(batch, device, non_blocking, memory_format)
        return transforms(images, train), labels  # normalise (and augment) on the device

    train_batches, val_batches = build_data(cfg, device, ranks.rank, ranks.world_size)  # 2-4, 6
    train_batches = prefetch_to_device(train_batches, cfg, device, memory_format)  # 7
    val_batches = prefetch_to_device(val_batches, cfg, device, memory_format)
    model = build_model(cfg.model, device, memory_format)  # + model.checkpointing
    model.train()
    advice = advise(cfg, model, device, precision.dtype)  # 9, 10, 15-18: once, with the fix
    if ranks.is_zero:
        log_findings(advice)
    mfu = MFU.measure(model, cfg, device, precision, memory_format, strategy)
    forward = wrap_model(maybe_compile(model, cfg.compile), strategy, device, cfg.distributed)  # 8
    optimizer = build_optimizer(model, cfg.optimizer)
    batches_per_epoch = len(train_batches)
    total_steps = cfg.max_steps or cfg.epochs * math.ceil(batches_per_epoch / cfg.accum)
    schedule = build_schedule(optimizer, cfg.optimizer, total_steps)
    config = OmegaConf.to_container(cfg, resolve=True)
    checkpoints = run_dir / "checkpoints"
    sharded = strategy == "fsdp"  # checkpoints gather the shards; resuming scatters them
    position = Position()
    if resume_from := find_resume(cfg.resume, checkpoints):
        state = load_checkpoint(resume_from)
        position = restore_training_state(
            state, resume_from, model, optimizer, precision.scaler, schedule, sharded
        )
        if changed := changed_settings(state["config"], config):  # a requeue changes nothing
            log.warning("resumed a run trained with other settings: %s", ", ".join(changed))
    finished = run_dir / "summary.json"
    if position.step >= total_steps and finished.is_file():  # a rerun of a finished run
        log.warning(
            "%s trained all %d steps already; nothing to do (resume=null trains it again)",
            run_dir,
            total_steps,
        )
        summary = json.loads(finished.read_text())
        return RunResult(model=model, optimizer=optimizer, summary=summary, steady=Interval())

    gears = resolved_gears(cfg, precision, device, strategy)
    workers = f"{gears['num_workers']} ({gears['num_workers_reason']})"
    log.info("on this machine: amp -> %s; loader workers -> %s", amp.reason, workers)
    rank_zero = ranks.is_zero
    logger = build_logger(cfg.logger, run_dir, config, run_name) if rank_zero else NullLogger()
    meter = PerfMeter(device, cfg.warmup_steps)
    n_params = sum(p.numel() for p in model.parameters())
    log.info(
        "%s on %s, %.2fM parameters, %d steps",
        type(model).__name__,
        device,
        n_params / 1e6,
        total_steps,
    )

    step, samples, epoch, start_batch = (
        position.step,
        position.samples,
        position.epoch,
        position.batch,
    )
    window_samples = 0
    last_loss = float("nan")
    val: dict[str, float | None] = {"val_loss": None, "val_accuracy": None}
    loss_sum = torch.zeros((), device=device)  # summed on the device, read at log steps only
    stop_agreed = False  # several ranks stop together, deciding at a log step
    summary: dict[str, Any] | None = None
    bar = progress_bar(enabled=rank_zero and cfg.progress_bar)

    def save_checkpoint_at(next_batch: int) -> Path | None:
        if not (rank_zero or sharded):  # sharded: every rank takes part in gathering the state
            return None
        model_state, optimizer_state = full_state(model, optimizer, sharded)
        if not rank_zero:
            return None
        done_epoch = next_batch == batches_per_epoch  # the next batch opens the next epoch
        where = Position(step, epoch + done_epoch, 0 if done_epoch else next_batch, samples)
        state = training_state(
            config, model_state, optimizer_state, precision.scaler, schedule, where
        )
        return save_checkpoint(state, checkpoints, step, keep=cfg.checkpoint.keep)

    def log_point() -> None:
        nonlocal last_loss, stop_agreed
        loss_total = loss_sum.item()  # the loop's one host-device sync
        loss_sum.zero_()
        interval = meter.flush()
        peak_bytes, _ = peak_memory(device)
        (loss_total, global_samples, stops), (peak_bytes,) = gather_sum_max(
            [loss_total, interval.samples, float(bool(stop))], [peak_bytes], device
        )
        last_loss = loss_total / (interval.steps * ranks.world_size)
        stop_agreed = stops > 0
        samples_per_sec = global_samples / interval.seconds
        metrics = {
            "train/loss": last_loss,
            "train/lr": optimizer.param_groups[0]["lr"],
            "perf/samples_per_sec": samples_per_sec,
            "perf/step_time_ms": interval.median_step_ms,
            "perf/data_wait_pct": interval.data_wait_pct,
            **mfu.metrics(samples_per_sec / ranks.world_size),
            "mem/peak_gib": peak_bytes / 2**30,
            **memory_metrics(device),
        }
        if precision.scaler.is_enabled():
            metrics["amp/grad_scale"] = precision.grad_scale()
            metrics["amp/skipped_steps"] = int(precision.skipped_steps)
        logger.log(metrics, step=step)
        bar.update(task, completed=step, samples_per_sec=samples_per_sec, loss=last_loss)
        bar.refresh()

    def validate() -> None:
        if val_batches is not None:
            val.update(evaluate(model, val_batches, place, precision))
            logger.log(
                {"val/loss": val["val_loss"], "val/accuracy": val["val_accuracy"]}, step=step
            )
            meter.resume()  # validation time is not training time

    # Plain values for the step: a DictConfig lookup costs microseconds, a local nothing.
    accum, set_to_none = cfg.accum, cfg.optimizer.set_to_none
    log_every, warmup_steps, val_every = (
        cfg.log_every_n_steps,
        cfg.warmup_steps,
        cfg.val_every_n_steps,
    )
    checkpoint_every, checkpoint_at_end = cfg.checkpoint.every_n_steps, cfg.checkpoint.at_end

    try:
        with bar, StopRequest() as stop:
            task = bar.add_task("train", total=total_steps, samples_per_sec=0.0, loss=float("nan"))
            bar.update(task, completed=step)
            meter.resume()
            while step < total_steps:
                train_batches.set_epoch(epoch, start_batch)
                for i, batch in enumerate(timed(train_batches, meter), start=start_batch):
                    window_start = i - i % accum
                    window_end = min(window_start + accum, batches_per_epoch)  # may be short
                    images, labels = place(batch, train=True)
                    with grad_sync(forward, enabled=i + 1 == window_end):  # 13: one all-reduce
                        with precision.autocast():
                            loss = F.cross_entropy(forward(images), labels)
                        if window_end - window_start > 1:
                            loss = loss / (window_end - window_start)  # grads sum to the mean
                        precision.backward(loss)
                    loss_sum += loss.detach()
                    window_samples += labels.shape[0]
                    if i + 1 < window_end:
                        continue  # accumulate: the optimizer steps once per window
                    precision.step(optimizer)
                    optimizer.zero_grad(set_to_none=set_to_none)  # 12
                    if schedule is not None:
                        schedule.step()
                    step += 1
                    samples += window_samples
                    meter.step(window_samples)
                    window_samples = 0
                    at_end = step == total_steps
                    if step % log_every == 0 or step == warmup_steps or at_end:
                        log_point()
                    stopping = stop_agreed if ranks.world_size > 1 else bool(stop)
                    saved = None
                    if (
                        stopping
                        or (checkpoint_every and step % checkpoint_every == 0)
                        or (at_end and checkpoint_at_end)
                    ):
                        saved = save_checkpoint_at(next_batch=i + 1)
                    if stopping:
                        raise stop.stopped(step, saved)
                    if val_every and step % val_every == 0 and not at_end:
                        validate()
                    if at_end:
                        break
                epoch, start_batch = epoch + 1, 0
        validate()
        summary = make_summary(
            meter, device, ranks.world_size, step, samples, last_loss, gears, val
        )
        summary |= {
            **mfu.summary(summary["samples_per_sec_per_device"]),
            "batch_size_finder": batch_choice.as_dict() if batch_choice else None,
            "advice": [finding.as_dict() for finding in advice],
        }
        if rank_zero:
            write_json_atomic(run_dir / "summary.json", summary)
            log_summary(summary)
            if cfg.progress_bar:
                print_summary(summary)
    finally:
        logger.finish(summary)
    return RunResult(model=model, optimizer=optimizer, summary=summary, steady=meter.steady_state())


def make_summary(
    meter: PerfMeter,
    device: torch.device,
    world_size: int,
    steps: int,
    samples: int,
    final_loss: float,
    gears: dict[str, Any],
    val: dict[str, float | None],
) -> dict[str, Any]:
    """summary.json: the keys the README lists, always all of them, reduced over ranks."""
    steady = meter.steady_state()
    local_peak, peak_kind = peak_memory(device)
    (steady_samples,), (seconds, peak_bytes) = gather_sum_max(
        [steady.samples], [steady.seconds, local_peak], device
    )
    samples_per_sec = steady_samples / seconds if seconds > 0 else 0.0
    return {
        "samples_per_sec": samples_per_sec,
        "samples_per_sec_per_device": samples_per_sec / world_size,
        "step_time_ms": steady.median_step_ms,
        "data_wait_pct": steady.data_wait_pct,
        "peak_memory_bytes": int(peak_bytes),
        "peak_memory_kind": peak_kind,
        "final_loss": final_loss,
        "steps": steps,
        "samples": samples * world_size,
        "world_size": world_size,
        "device": str(device),
        "gears": gears,
        **val,
    }


def log_summary(summary: dict[str, Any]) -> None:
    log.info(
        "%.1f samples/s, step %.1f ms, data wait %.1f%%, peak %s %.0f MiB, loss %.4f",
        summary["samples_per_sec"],
        summary["step_time_ms"],
        summary["data_wait_pct"],
        summary["peak_memory_kind"],
        summary["peak_memory_bytes"] / 2**20,
        summary["final_loss"],
    )


def resolved_gears(
    cfg: DictConfig, precision: Precision, device: torch.device, strategy: str
) -> dict[str, Any]:
    """The switches as they act on this machine (amp=on resolved to its dtype, workers counted)."""
    dl = cfg.dataloader
    on_device = cfg.data.on_device
    workers, workers_reason = loader_workers(dl.num_workers, device)
    if on_device:
        workers, workers_reason = 0, "data.on_device=true: no loader"
    return {
        "amp": str(precision.dtype).removeprefix("torch.") if precision.dtype else "off",
        "amp_reason": precision.reason,
        "grad_scaler": precision.scaler.is_enabled(),
        "accum": cfg.accum,
        "batch_size": cfg.batch_size,
        "memory_format": "channels_last" if cfg.memory_format.channels_last else "contiguous",
        "data_on_device": on_device,
        "num_workers": workers,
        "num_workers_reason": workers_reason,
        "pin_memory": False if on_device else resolve_pin_memory(dl.pin_memory, device),
        "non_blocking": dl.non_blocking,
        "prefetch_to_device": prefetch_active(cfg, device),
        "device_transforms": DeviceTransforms.describe(cfg.device_transforms),
        "checkpointing": bool(cfg.model.get("checkpointing", False)),
        "compile": cfg.compile.mode if cfg.compile.enabled else "off",
        "cudnn_benchmark": cfg.cudnn_benchmark,
        "matmul_precision": cfg.matmul_precision,
        "optimizer": cfg.optimizer.name,
        "fused": cfg.optimizer.fused,
        "foreach": cfg.optimizer.foreach,
        "set_to_none": cfg.optimizer.set_to_none,
        "distributed": strategy,
    }
