"""What a run reports at its end: summary.json's figures, the log line, the closing table."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from gearshift.observe.console import print_summary
from gearshift.observe.loggers import write_json_atomic
from gearshift.observe.throughput import PerfMeter, peak_memory
from gearshift.parallel.distributed import gather_sum_max

log = logging.getLogger(__name__)


def make_summary(
    meter: PerfMeter,
    device: torch.device,
    world_size: int,
    steps: int,
    samples: tuple[int, int],
    final_loss: float,
    gears: Mapping[str, Any],
    val: dict[str, float | None],
) -> dict[str, Any]:
    """summary.json's figures (docs/observing.md: "What a run leaves behind"), reduced over ranks.
    `samples`: Position.samples_counted."""
    steady = meter.steady_state()
    local_peak, peak_kind = peak_memory(device)
    before, since = samples
    (steady_samples, job_samples), (seconds, peak_bytes) = gather_sum_max(
        [steady.samples, since], [steady.seconds, local_peak], device
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
        "samples": before + int(job_samples),
        "world_size": world_size,
        "device": str(device),
        "gears": dict(gears),
        "environment": run_environment(),
        **val,
    }


def run_environment() -> dict[str, Any]:
    """What this process was given to run on: the CPU cores it may use (a launcher's slot,
    a job's or a container's share), torch's threads, and the GPUs it was shown."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "cpu_cores": cores,
        "torch_threads": torch.get_num_threads(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def write_summary(run_dir: Path, summary: dict[str, Any], table: bool) -> None:
    """summary.json, the log line, and (`table`) the closing table on the console."""
    write_json_atomic(run_dir / "summary.json", summary)
    log.info(
        "%.1f samples/s, step %.1f ms, data wait %.1f%%, peak %s %.0f MiB, loss %.4f",
        summary["samples_per_sec"],
        summary["step_time_ms"],
        summary["data_wait_pct"],
        summary["peak_memory_kind"],
        summary["peak_memory_bytes"] / 2**20,
        summary["final_loss"],
    )
    if table:
        print_summary(summary)


def finished_summary(run_dir: Path, ended: bool, total_steps: int) -> dict[str, Any] | None:
    """A rerun of a finished run (`ended`) trains nothing and keeps its summary."""
    finished = run_dir / "summary.json"
    if not ended or not finished.is_file():
        return None
    log.warning(
        "%s trained all %d steps already; nothing to do (resume=null trains it again)",
        run_dir,
        total_steps,
    )
    return json.loads(finished.read_text())
