"""What each gear bought: a table (and chart) of the runs in a sweep folder.

    python scripts/report.py multirun/2026-11-30_12-00-00

Reads every run folder below the given one (a run folder holds `.hydra/`), ranks the
runs by throughput with speed-up and peak-memory change against the baseline run, and
writes `report.md` and `report.png` beside them. A run without a summary.json failed:
it is listed as failed, not dropped. The baseline is the run whose overrides switch no
gear (or say experiment=baseline or gear=baseline, as in `make ablation`), else the
slowest run.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

# Overrides that change the workload or the bookkeeping, not a gear.
NOT_GEARS = (
    "max_steps",
    "epochs",
    "seed",
    "logger",
    "log_every",
    "warmup_steps",
    "device",
    "hydra",
    "model",
    "data.",
    "batch_size",
    "progress_bar",
    "sweep",
    "hparams_search",
)
GEARS_ANYWAY = ("model.checkpointing", "batch_size=auto")  # gears under those prefixes


@dataclass
class Run:
    folder: Path
    gears: list[str]  # the overrides that switch gears
    summary: dict | None  # None: the run failed

    @property
    def failed(self) -> bool:
        return self.summary is None

    @property
    def name(self) -> str:
        return " ".join(self.gears) or "baseline"


def gear_overrides(folder: Path) -> list[str]:
    overrides_file = folder / ".hydra" / "overrides.yaml"
    overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file.exists() else []
    return [o for o in overrides or [] if is_gear(o.lstrip("+~"))]


def is_gear(override: str) -> bool:
    return override.startswith(GEARS_ANYWAY) or not override.startswith(NOT_GEARS)


def load_runs(root: Path) -> list[Run]:
    runs = []
    for hydra_dir in sorted(root.glob("**/.hydra")):
        folder = hydra_dir.parent
        summary_file = folder / "summary.json"
        summary = json.loads(summary_file.read_text()) if summary_file.exists() else None
        runs.append(Run(folder=folder, gears=gear_overrides(folder), summary=summary))
    return runs


BASELINE_GEARS = ([], ["experiment=baseline"], ["gear=baseline"])


def pick_baseline(runs: list[Run]) -> Run | None:
    done = [r for r in runs if not r.failed]
    plain = [r for r in done if r.gears in BASELINE_GEARS]
    return (
        plain[0] if plain else min(done, key=lambda r: r.summary["samples_per_sec"], default=None)
    )


def rows(runs: list[Run]) -> list[dict]:
    base = pick_baseline(runs)
    table = []
    for run in sorted(runs, key=lambda r: -r.summary["samples_per_sec"] if r.summary else math.inf):
        s = run.summary
        if s is None:
            table.append({"name": run.name, "status": "failed"})
            continue
        b = base.summary
        table.append(
            {
                "name": run.name
                + (" (baseline)" if run is base and "baseline" not in run.name else ""),
                "status": "ok",
                "samples_per_sec": s["samples_per_sec"],
                "speedup": s["samples_per_sec"] / b["samples_per_sec"],
                "peak_mib": s["peak_memory_bytes"] / 2**20,
                "memory_change_pct": 100 * (s["peak_memory_bytes"] / b["peak_memory_bytes"] - 1),
                "data_wait_pct": s["data_wait_pct"],
                "step_time_ms": s["step_time_ms"],
                "final_loss": s["final_loss"],
            }
        )
    return table


COLUMNS = ("run", "samples/s", "speed-up", "peak MiB", "memory", "data wait", "step ms", "loss")


def cells(row: dict) -> list[str]:
    if row["status"] == "failed":
        return [row["name"], "failed", "", "", "", "", "", ""]
    return [
        row["name"],
        f"{row['samples_per_sec']:,.1f}",
        f"{row['speedup']:.2f}x",
        f"{row['peak_mib']:,.0f}",
        f"{row['memory_change_pct']:+.0f}%",
        f"{row['data_wait_pct']:.1f}%",
        f"{row['step_time_ms']:.1f}",
        f"{row['final_loss']:.4f}",
    ]


def markdown(table: list[dict], title: str) -> str:
    lines = [f"# {title}", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cells(row)) + " |" for row in table]
    return "\n".join(lines) + "\n"


def plot(table: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in table if r["status"] == "ok"][::-1]
    names = [r["name"] for r in done]
    fig, (speed, memory) = plt.subplots(1, 2, figsize=(12, 1.2 + 0.45 * len(done)), sharey=True)
    speed.barh(names, [r["samples_per_sec"] for r in done], color="tab:blue")
    speed.set_xlabel("samples/s")
    memory.barh(names, [r["peak_mib"] for r in done], color="tab:orange")
    memory.set_xlabel("peak memory (MiB)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description="Gear report of a sweep folder")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args()
    runs = load_runs(args.folder)
    if not runs:
        raise SystemExit(f"error: no run folders (with .hydra/) under {args.folder}")
    table = rows(runs)
    title = f"gear report: {args.folder}"
    (args.folder / "report.md").write_text(markdown(table, title))
    if not args.no_plot:
        plot(table, args.folder / "report.png", title)
    console_table = Table(title=title)
    for column in COLUMNS:
        console_table.add_column(column, justify="left" if column == "run" else "right")
    for row in table:
        console_table.add_row(*cells(row), style="red" if row["status"] == "failed" else None)
    Console(width=160).print(console_table)


if __name__ == "__main__":
    main()
