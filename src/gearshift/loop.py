"""The training loop: a plain PyTorch loop with each gear applied in one place.

The numbers in the comments are the tips of DESIGN.md's gear table. The host waits for
the device only at log steps (reading the loss); everything else stays asynchronous.
"""

from __future__ import annotations

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
from gearshift.console import print_summary, progress_bar
from gearshift.data import build_data, resolve_num_workers, resolve_pin_memory, to_device
from gearshift.device_transforms import DeviceTransforms
from gearshift.loggers import NullLogger, build_logger, write_json_atomic
from gearshift.metrics import Interval, PerfMeter, memory_metrics, peak_memory
from gearshift.mfu import MFU
from gearshift.models import build_model, maybe_compile
from gearshift.optim import build_optimizer, build_schedule
from gearshift.precision import Precision, resolve_amp_dtype
from gearshift.prefetch import prefetch_active, prefetch_to_device
from gearshift.runtime import configure_backends, is_rank_zero, resolve_device, seed_everything

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
    return {"val_loss": loss_sum.item() / count, "val_accuracy": correct.item() / count}


def fit(cfg: DictConfig, run_dir: Path, run_name: str | None = None) -> RunResult:
    """Train as `cfg` says; write summary.json (and W&B) into `run_dir` on rank 0."""
    device = resolve_device(cfg.device)
    seed_everything(cfg.seed)
    configure_backends(device, cfg.cudnn_benchmark, cfg.matmul_precision)  # 15, TF32
    precision = Precision(resolve_amp_dtype(cfg.amp.dtype, device), device)  # 11
    channels_last = cfg.memory_format.channels_last  # 16
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    non_blocking = cfg.dataloader.non_blocking  # 7
    cfg, batch_choice = resolve_batch_size(cfg, device, precision.dtype, memory_format)  # 10
    transforms = DeviceTransforms(cfg.device_transforms, device, memory_format, cfg.seed)

    def place(batch, train: bool = False):
        images, labels = to_device(batch, device, non_blocking, memory_format)
        return transforms(images, train), labels  # normalise (and augment) on the device

    train_batches, val_batches = build_data(cfg, device)  # 2, 3, 4, 6
    train_batches = prefetch_to_device(train_batches, cfg, device, memory_format)  # 7
    val_batches = prefetch_to_device(val_batches, cfg, device, memory_format)
    model = build_model(cfg.model, device, memory_format)  # + model.checkpointing
    model.train()
    advice = advise(cfg, model, device, precision.dtype)  # 9, 10, 15-18: once, with the fix
    log_findings(advice)
    mfu = MFU.measure(model, cfg, device, precision, memory_format)
    optimizer = build_optimizer(model, cfg.optimizer)
    batches_per_epoch = len(train_batches)
    total_steps = cfg.max_steps or cfg.epochs * math.ceil(batches_per_epoch / cfg.accum)
    schedule = build_schedule(optimizer, cfg.optimizer, total_steps)
    forward = maybe_compile(model, cfg.compile)  # 8

    gears = resolved_gears(cfg, precision, device)
    rank_zero = is_rank_zero()
    config = OmegaConf.to_container(cfg, resolve=True)
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

    step = samples = window_samples = 0
    last_loss = float("nan")
    val: dict[str, float | None] = {"val_loss": None, "val_accuracy": None}
    loss_sum = torch.zeros((), device=device)  # summed on the device, read at log steps only
    summary: dict[str, Any] | None = None
    bar = progress_bar(enabled=rank_zero and cfg.progress_bar)

    def log_point() -> None:
        nonlocal last_loss
        loss_total = loss_sum.item()  # the loop's one host-device sync
        loss_sum.zero_()
        interval = meter.flush()
        last_loss = loss_total / interval.steps
        metrics = {
            "train/loss": last_loss,
            "train/lr": optimizer.param_groups[0]["lr"],
            "perf/samples_per_sec": interval.samples_per_sec,
            "perf/step_time_ms": interval.median_step_ms,
            "perf/data_wait_pct": interval.data_wait_pct,
            **mfu.metrics(interval.samples_per_sec),
            **memory_metrics(device),
        }
        if precision.scaler.is_enabled():
            metrics["amp/grad_scale"] = precision.grad_scale()
            metrics["amp/skipped_steps"] = int(precision.skipped_steps)
        logger.log(metrics, step=step)
        bar.update(task, completed=step, samples_per_sec=interval.samples_per_sec, loss=last_loss)
        bar.refresh()

    def validate() -> None:
        if val_batches is not None:
            val.update(evaluate(model, val_batches, place, precision))
            logger.log(
                {"val/loss": val["val_loss"], "val/accuracy": val["val_accuracy"]}, step=step
            )
            meter.resume()  # validation time is not training time

    try:
        with bar:
            task = bar.add_task("train", total=total_steps, samples_per_sec=0.0, loss=float("nan"))
            meter.resume()
            while step < total_steps:
                for i, batch in enumerate(timed(train_batches, meter)):
                    window_start = i - i % cfg.accum
                    window = min(cfg.accum, batches_per_epoch - window_start)  # last may be short
                    images, labels = place(batch, train=True)
                    with precision.autocast():
                        loss = F.cross_entropy(forward(images), labels)
                    if window > 1:
                        loss = loss / window  # 13: the window's gradients sum to its mean
                    precision.backward(loss)
                    loss_sum += loss.detach()
                    window_samples += labels.shape[0]
                    if i + 1 < window_start + window:
                        continue  # accumulate: the optimizer steps once per window
                    precision.step(optimizer)
                    optimizer.zero_grad(set_to_none=cfg.optimizer.set_to_none)  # 12
                    if schedule is not None:
                        schedule.step()
                    step += 1
                    samples += window_samples
                    meter.step(window_samples)
                    window_samples = 0
                    at_end = step == total_steps
                    if step % cfg.log_every_n_steps == 0 or step == cfg.warmup_steps or at_end:
                        log_point()
                    if cfg.val_every_n_steps and step % cfg.val_every_n_steps == 0 and not at_end:
                        validate()
                    if at_end:
                        break
        validate()
        steady = meter.steady_state()
        peak_bytes, peak_kind = peak_memory(device)
        world_size = 1
        summary = {
            "samples_per_sec": steady.samples_per_sec * world_size,
            "samples_per_sec_per_device": steady.samples_per_sec,
            "step_time_ms": steady.median_step_ms,
            "data_wait_pct": steady.data_wait_pct,
            "peak_memory_bytes": peak_bytes,
            "peak_memory_kind": peak_kind,
            "final_loss": last_loss,
            "steps": step,
            "samples": samples * world_size,
            "world_size": world_size,
            "device": str(device),
            "gears": gears,
            **val,
            **mfu.summary(steady.samples_per_sec),
            "batch_size_finder": batch_choice.as_dict() if batch_choice else None,
            "advice": [finding.as_dict() for finding in advice],
        }
        if rank_zero:
            write_json_atomic(run_dir / "summary.json", summary)
            log.info(
                "%.1f samples/s, step %.1f ms, data wait %.1f%%, peak %s %.0f MiB, loss %.4f",
                summary["samples_per_sec"],
                summary["step_time_ms"],
                summary["data_wait_pct"],
                peak_kind,
                peak_bytes / 2**20,
                last_loss,
            )
            if cfg.progress_bar:
                print_summary(summary)
    finally:
        logger.finish(summary)
    return RunResult(model=model, optimizer=optimizer, summary=summary, steady=steady)


def resolved_gears(cfg: DictConfig, precision: Precision, device: torch.device) -> dict[str, Any]:
    """The switches as they act on this machine (amp=on resolved to its dtype, workers counted)."""
    dl = cfg.dataloader
    on_device = cfg.data.on_device
    return {
        "amp": str(precision.dtype).removeprefix("torch.") if precision.dtype else "off",
        "grad_scaler": precision.scaler.is_enabled(),
        "accum": cfg.accum,
        "batch_size": cfg.batch_size,
        "memory_format": "channels_last" if cfg.memory_format.channels_last else "contiguous",
        "data_on_device": on_device,
        "num_workers": 0 if on_device else resolve_num_workers(dl.num_workers),
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
    }
