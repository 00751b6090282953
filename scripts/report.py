"""What each gear bought: a table (and chart) of the runs in a sweep folder.

    python scripts/report.py multirun/2026-11-30_12-00-00

Reads every run folder below the given one (a run folder holds `.hydra/`), ranks the
runs by throughput with speed-up and peak-memory change against the baseline run, and
writes `report.md` and `report.png` beside them. A run without a summary.json failed:
it is listed as failed, not dropped. Runs with the same gears (a sweep that repeats each
configuration, seed=0,1,2 as in `make ablation`) are one row: the fastest of them, with the
spread of their throughputs. The baseline is the configuration whose overrides switch
no gear (or say experiment=baseline or gear=baseline), else the slowest one.
"""

from __future__ import annotations

import argparse
import json
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
# gears under those prefixes (data.on_device: batches made on the device, tip 4 of docs/gears.md)
GEARS_ANYWAY = ("model.checkpointing", "batch_size=auto", "data.on_device")


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


def natural_order(path: Path) -> list:
    """multirun/2/ before multirun/10/."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in path.parts]


def load_runs(root: Path) -> list[Run]:
    """Every run below `root`, named by the gear overrides that tell it from the others
    (a gear set on the whole sweep's command line is in every name, so in none)."""
    runs = []
    for hydra_dir in sorted(root.glob("**/.hydra"), key=natural_order):
        folder = hydra_dir.parent
        summary_file = folder / "summary.json"
        summary = json.loads(summary_file.read_text()) if summary_file.exists() else None
        runs.append(Run(folder=folder, gears=gear_overrides(folder), summary=summary))
    if len(runs) > 1:
        shared = set.intersection(*(set(run.gears) for run in runs))
        for run in runs:
            run.gears = [g for g in run.gears if g not in shared]
    return runs


BASELINE_GEARS = ([], ["experiment=baseline"], ["gear=baseline"])


@dataclass
class Config:
    """One configuration of gears and its runs: several when the sweep repeats it (seed=0,1,2)."""

    name: str
    runs: list[Run]

    @property
    def done(self) -> list[dict]:
        return [r.summary for r in self.runs if not r.failed]

    @property
    def failed(self) -> list[Run]:
        return [r for r in self.runs if r.failed]

    @property
    def best(self) -> dict:
        """The fastest run's summary. Interference (other processes, a busy neighbour on a
        shared host) only ever slows a run down, so the fastest repeat is the closest to
        what the configuration does on its own (the reasoning of Python's timeit)."""
        return max(self.done, key=lambda s: s["samples_per_sec"])

    @property
    def samples_per_sec(self) -> float:
        return self.best["samples_per_sec"]


def group(runs: list[Run]) -> list[Config]:
    by_name: dict[str, Config] = {}
    for run in runs:
        by_name.setdefault(run.name, Config(run.name, [])).runs.append(run)
    return list(by_name.values())


def pick_baseline(configs: list[Config]) -> Config | None:
    done = [c for c in configs if c.done]
    plain = [c for c in done if c.runs[0].gears in BASELINE_GEARS]
    return plain[0] if plain else min(done, key=lambda c: c.samples_per_sec, default=None)


def rows(runs: list[Run]) -> list[dict]:
    """One row per configuration (its fastest run), then one per failed run."""
    configs = group(runs)
    base = pick_baseline(configs)
    table = []
    b = base.best if base else None
    for config in sorted((c for c in configs if c.done), key=lambda c: -c.samples_per_sec):
        best = config.best
        throughputs = [s["samples_per_sec"] for s in config.done]
        table.append(
            {
                "name": config.name
                + (" (baseline)" if config is base and "baseline" not in config.name else ""),
                "status": "ok",
                "runs": len(throughputs),
                "samples_per_sec": best["samples_per_sec"],
                # how far the repeats disagree: what noise alone can do to a speed-up
                "spread_pct": 100 * (1 - min(throughputs) / max(throughputs))
                if len(throughputs) > 1
                else None,
                "speedup": best["samples_per_sec"] / b["samples_per_sec"],
                "peak_mib": best["peak_memory_bytes"] / 2**20,
                "memory_change_pct": 100 * (best["peak_memory_bytes"] / b["peak_memory_bytes"] - 1),
                "data_wait_pct": best["data_wait_pct"],
                "step_time_ms": best["step_time_ms"],
                "final_loss": best["final_loss"],
            }
        )
    for config in configs:
        for run in config.failed:
            table.append({"name": config.name, "status": "failed", "folder": str(run.folder)})
    return table


COLUMNS = (
    "run",
    "runs",
    "samples/s",
    "spread",
    "speed-up",
    "peak MiB",
    "memory",
    "data wait",
    "step ms",
    "loss",
)


def cells(row: dict) -> list[str]:
    if row["status"] == "failed":
        return [row["name"], "1", "failed", *[""] * (len(COLUMNS) - 3)]
    return [
        row["name"],
        str(row["runs"]),
        f"{row['samples_per_sec']:,.1f}",
        "-" if row["spread_pct"] is None else f"{row['spread_pct']:.0f}%",
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
    lines += ["", NOTE]
    failed = [row for row in table if row["status"] == "failed"]
    if failed:
        lines += ["", "Failed runs (no summary.json; see train.log and .submitit/ logs):", ""]
        lines += [f"- {row['name']}: {row['folder']}" for row in failed]
    return "\n".join(lines) + "\n"


NOTE = (
    "Each row is the configuration's fastest run (noise only slows runs down); runs is how "
    "many finished, and spread is 1 - slowest / fastest of their throughputs: a speed-up "
    "smaller than that can be noise."
)


def plot(table: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in table if r["status"] == "ok"][::-1]
    names = [r["name"] for r in done]
    fig, (speed, memory) = plt.subplots(1, 2, figsize=(12, 1.2 + 0.45 * len(done)), sharey=True)
    speed.barh(names, [r["samples_per_sec"] for r in done], color="tab:blue")
    for y, r in enumerate(done):
        speed.annotate(f" {r['speedup']:.2f}x", (r["samples_per_sec"], y), va="center")
    speed.set_xlabel("samples/s (fastest run)")
    speed.margins(x=0.15)
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
