"""scripts/report.py on a sweep folder with finished runs and one failed run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, seconds

MIB = 2**20


def fake_run(folder: Path, overrides: list[str], summary: dict | None) -> None:
    """A run folder as Hydra and gearshift leave it; no summary.json: the run failed."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))


def summary(samples_per_sec: float, peak_mib: float, loss: float, data_wait: float = 2.0) -> dict:
    return {
        "samples_per_sec": samples_per_sec,
        "samples_per_sec_per_device": samples_per_sec,
        "step_time_ms": 64_000 / samples_per_sec,
        "data_wait_pct": data_wait,
        "peak_memory_bytes": int(peak_mib * MIB),
        "peak_memory_kind": "cpu_rss",
        "final_loss": loss,
        "steps": 100,
        "samples": 6400,
        "world_size": 1,
        "device": "cpu",
        "gears": {},
        "val_loss": loss,
        "val_accuracy": 0.5,
    }


@pytest.fixture
def sweep_dir(tmp_path) -> Path:
    root = tmp_path / "multirun" / "ablation"
    # not gears, or gears every run shares: no part of a name
    common = ["sweep=ablation", "max_steps=100", "data.on_device=false", "logger=none", "amp=on"]
    fake_run(root / "0", ["gear=baseline", *common], summary(400.0, 1000, 1.50, data_wait=20.0))
    fake_run(root / "1", ["gear=amp", *common], summary(540.0, 900, 1.52))
    fake_run(root / "2", ["gear=compile", *common], None)  # crashed: no summary.json
    fake_run(root / "3", ["gear=all", *common], summary(700.0, 1100, 1.49))
    (root / "multirun.yaml").write_text("{}\n")  # Hydra's own file beside the runs
    return root


def report(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "report.py"), str(folder)],
        capture_output=True,
        text=True,
        timeout=seconds(120),
    )


def table_rows(markdown: str) -> list[list[str]]:
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def test_report_ranks_by_throughput_against_the_baseline_and_lists_the_failed_run(sweep_dir):
    done = report(sweep_dir)
    assert done.returncode == 0, done.stderr
    rows = table_rows((sweep_dir / "report.md").read_text())
    assert [row[0] for row in rows] == ["gear=all", "gear=amp", "gear=baseline", "gear=compile"]
    all_gears, amp, baseline, failed = rows
    # run, runs, samples/s, spread, speed-up, peak MiB, memory, data wait, step ms, loss
    assert all_gears[1:] == ["1", "700.0", "-", "1.75x", "1,100", "+10%", "2.0%", "91.4", "1.4900"]
    assert amp[4:7] == ["1.35x", "900", "-10%"]
    assert baseline[1:8] == ["1", "400.0", "-", "1.00x", "1,000", "+0%", "20.0%"]
    assert failed[1:3] == ["1", "failed"] and set(failed[3:]) == {""}
    assert "failed" in done.stdout and "gear=compile" in done.stdout  # the console table too
    assert (sweep_dir / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_repeated_runs_are_one_row_their_fastest_and_a_failed_repeat_is_listed(tmp_path):
    root = tmp_path / "ablation"
    runs = [  # seed is the outer loop, as in sweep=ablation
        ("baseline", 0, summary(400.0, 1000, 1.0)),
        ("amp", 0, summary(540.0, 950, 1.1)),
        ("baseline", 1, summary(380.0, 1010, 1.2)),
        ("amp", 1, None),  # this repeat crashed
        ("baseline", 2, summary(420.0, 990, 1.4)),
        ("amp", 2, summary(588.0, 900, 1.3)),
    ]
    for n, (gear, seed, result) in enumerate(runs):
        fake_run(root / str(n), [f"seed={seed}", f"gear={gear}", "sweep=ablation"], result)
    done = report(root)
    assert done.returncode == 0, done.stderr
    markdown = (root / "report.md").read_text()
    amp, baseline, failed = table_rows(markdown)[:3]
    # the fastest runs: amp 588 (of 540, 588) = 1.40x the baseline's 420 (of 380, 400, 420)
    assert amp[:7] == ["gear=amp", "2", "588.0", "8%", "1.40x", "900", "-9%"]
    assert baseline[:7] == ["gear=baseline", "3", "420.0", "10%", "1.00x", "990", "+0%"]
    assert baseline[9] == "1.4000"  # every figure of a row is its fastest run's
    assert failed[:3] == ["gear=amp", "1", "failed"]
    assert f"- gear=amp: {root / '3'}" in markdown  # where to look for what went wrong


def test_report_of_a_folder_without_runs_is_one_clear_error(tmp_path):
    done = report(tmp_path)
    assert done.returncode != 0
    assert done.stderr.strip() == f"error: no run folders (with .hydra/) under {tmp_path}"
    assert not (tmp_path / "report.md").exists()
