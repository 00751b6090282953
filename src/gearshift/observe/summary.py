"""summary.json written (with the log line and the closing table; atomically, as is eval.json)
and a finished run's read back; reporting.py `summarize` gathers its figures."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from gearshift.observe.console import print_summary

log = logging.getLogger(__name__)


def run_environment() -> dict[str, Any]:
    """summary.json's `environment` (docs/observing.md): what this process was given to run on."""
    return {
        "cpu_cores": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": torch.get_num_threads(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write to a temporary file and rename it over `path`: readers never see half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


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
