"""What a run reports at its end: summary.json's figures, the log line, the resolved gears."""

from __future__ import annotations

import logging
from typing import Any

import torch
from omegaconf import DictConfig

from gearshift.data.device_transforms import DeviceTransforms
from gearshift.data.loading import loader_workers, resolve_pin_memory
from gearshift.data.prefetch import prefetch_active
from gearshift.engine.precision import Precision, amp_name
from gearshift.engine.runtime import deterministic_on
from gearshift.models.build import resolve_compile
from gearshift.observe.metrics import PerfMeter, peak_memory
from gearshift.parallel.distributed import gather_sum_max

log = logging.getLogger(__name__)


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
    """summary.json's figures (README: "What a run leaves behind"), reduced over ranks."""
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
    on_device = bool(cfg.data.get("on_device"))
    workers, workers_reason = loader_workers(dl.num_workers, device)
    compiled, compile_reason = resolve_compile(cfg.compile.enabled, device)
    if on_device:
        workers, workers_reason = 0, "data.on_device=true: no loader"
    return {
        "amp": amp_name(precision.dtype),
        "amp_reason": precision.reason,
        "grad_scaler": precision.scaler.is_enabled(),
        "accum": cfg.accum,
        "batch_size": cfg.batch_size,
        "memory_format": "channels_last" if cfg.memory_format.channels_last else "contiguous",
        "data_on_device": on_device,
        "data_decode": cfg.data.get("decode", "host"),  # gpu: JPEGs decoded on the device
        "num_workers": workers,
        "num_workers_reason": workers_reason,
        "pin_memory": False if on_device else resolve_pin_memory(dl.pin_memory, device),
        "non_blocking": dl.non_blocking,
        "prefetch_to_device": prefetch_active(cfg, device),
        "device_transforms": DeviceTransforms.describe(cfg.device_transforms),
        "checkpointing": bool(cfg.model.get("checkpointing", False)),
        "compile": cfg.compile.mode if compiled else "off",
        "compile_reason": compile_reason,
        "cudnn_benchmark": cfg.cudnn_benchmark and not deterministic_on(cfg.deterministic),
        "deterministic": cfg.deterministic,
        "matmul_precision": cfg.matmul_precision,
        "optimizer": cfg.optimizer.name,
        "fused": cfg.optimizer.fused,
        "foreach": cfg.optimizer.foreach,
        "set_to_none": cfg.optimizer.set_to_none,
        "distributed": strategy,
    }
