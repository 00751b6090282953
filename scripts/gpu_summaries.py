"""The tables scripts/gpu_check.sh prints from its runs' summary.json files, one per step.

    python scripts/gpu_summaries.py runs   FOLDER               each run under FOLDER
    python scripts/gpu_summaries.py images BASE RUN [RUN ...]   img/s against BASE's
    python scripts/gpu_summaries.py tokens RUN [RUN ...]        GPT-2: tokens/s, MFU, FLOPs
    python scripts/gpu_summaries.py plan   RUN [RUN ...]        planned against measured

A run that left no summary.json is one "failed" row; the others go on.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

GIB = 2**30


def summaries(runs: Iterable[Path], width: int) -> Iterable[tuple[str, dict]]:
    """(name, summary) of each run with a summary.json; a "failed" row for each without."""
    for run in runs:
        path = run / "summary.json"
        if path.is_file():
            yield run.name, json.loads(path.read_text())
        else:
            print(f"{run.name:<{width}} failed (no summary.json)")


def mfu(s: dict) -> str:
    return f"{s['mfu']:.3f}" if s.get("mfu") is not None else "n/a"


def runs_table(folder: Path) -> None:
    for name, s in summaries(sorted(p.parent for p in folder.glob("*/summary.json")), 16):
        advice = ", ".join(a["id"] for a in s.get("advice", [])) or "-"
        print(f"{name:<16} mfu {mfu(s):>6}  batch {s['gears']['batch_size']:>5}  "
              f"peak {s['peak_memory_bytes'] / GIB:6.2f} GiB  advice: {advice}")  # fmt: skip
        if name == "baseline":
            print(f"{'':<16} peak source: {s.get('peak_flops_source')}")


def images_table(base: Path, *runs: Path) -> None:
    base_file = base / "summary.json"
    base_rate = json.loads(base_file.read_text())["samples_per_sec"] if base_file.is_file() else 0
    for name, s in summaries(runs, 18):
        ratio = f"{s['samples_per_sec'] / base_rate:.2f}x synthetic" if base_rate else ""
        print(f"{name:<18} {s['samples_per_sec']:8.0f} img/s  data wait "
              f"{s['data_wait_pct']:5.1f}%  workers {s['gears']['num_workers']}  {ratio}")  # fmt: skip


def tokens_table(*runs: Path) -> None:
    for name, s in summaries(runs, 14):
        g = s["gears"]
        print(f"{name:<14} {s['tokens_per_sec']:10.0f} tokens/s  mfu {mfu(s)}  "
              f"peak {s['peak_memory_bytes'] / GIB:5.1f} GiB  amp {g['amp']}  "
              f"compile {g['compile']}  fused {g['fused']}")  # fmt: skip
        print(f"{'':<14} flops: {s['flops_source']} ({s['flops_per_sample']:.3g} per sample; "
              f"counted {s['flops_per_sample_counted']:.3g})")  # fmt: skip


def within(ratio: float, goal: float) -> str:
    return "ok" if abs(ratio - 1) <= goal else f"OFF (goal {goal:.0%})"


def plan_table(*runs: Path) -> None:
    for name, s in summaries(runs, 10):
        p = s["plan"]
        peak, step = p["peak_ratio"], p["step_time_ratio"]
        print(f"{name:<10} peak planned {p['predicted_peak_bytes'] / GIB:6.2f} GiB, measured "
              f"{p['measured_peak_bytes'] / GIB:6.2f} GiB ({p['measured_peak_kind']}), ratio "
              f"{peak:.3f} {within(peak, 0.10)}")  # fmt: skip
        print(f"{'':<10} step planned {p['predicted_step_time_s'] * 1e3:7.1f} ms, measured "
              f"{p['measured_step_time_s'] * 1e3:7.1f} ms, ratio {step:.3f} "
              f"{within(step, 0.25)}; planned in {p['plan_seconds']:.1f} s")  # fmt: skip


TABLES: dict[str, Callable[..., None]] = {
    "runs": runs_table,
    "images": images_table,
    "tokens": tokens_table,
    "plan": plan_table,
}

if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in TABLES:
        sys.exit(__doc__)
    TABLES[sys.argv[1]](*map(Path, sys.argv[2:]))
