"""What each gear bought, told from noise and from a gear that did not act.

    python scripts/report.py multirun/ablation_2026-11-30_12-00-00

Reads every run folder below the given one (a run folder holds `.hydra/`). Runs with the
same gear overrides are one configuration; the baseline is the configuration whose
overrides switch no gear (or say gear=baseline or experiment=baseline), else the slowest.
The other overrides that differ between runs (seed=0, seed=1, ... in `make ablation`) are
the run's round: each gear run is paired with the baseline run of its round, and a
configuration's effect is the median of its pairs' ratios with an interval
(scripts/report_effects.py). A configuration whose resolved gears (summary.json `gears`)
equal the baseline's on the device it ran on did not act there: it is listed apart with
the reason, not ranked.

The folder of an Optuna search (hydra/sweeper=gearshift_optuna: a study journal in it, or
its multirun.yaml names the study's storage) gets the study report instead
(hydra_plugins/gearshift_sweeper/_report.py: study_report.md and its plots).

Writes `report.md`, `report.json` and `report.png` into the folder, prints the tables,
and logs the same tables and chart to the sweep's W&B group when its runs logged to W&B.
A run without a summary.json failed: it is listed as failed, not dropped.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from importlib.util import find_spec
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules, however loaded
from report_effects import (
    BASELINE,
    DID_NOT_ACT,
    FASTER,
    MIN_PAIRS,
    NOISE,
    SLOWER,
    Combination,
    Effect,
    Ratio,
    baseline_effect,
    combinations,
    describe_interval,
    mark_same_settings,
    measure,
    ranking,
    run_spread,
    shown,
)

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
    round: tuple[str, ...] = ()  # the other overrides: the runs of one round share them
    order: int = 0  # its place in the sweep (Hydra's job numbers)

    @property
    def failed(self) -> bool:
        return self.summary is None

    @property
    def name(self) -> str:
        return " ".join(self.gears) or "baseline"


def run_overrides(folder: Path) -> list[str]:
    overrides_file = folder / ".hydra" / "overrides.yaml"
    overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file.exists() else []
    return list(overrides or [])


def gear_overrides(folder: Path) -> list[str]:
    return [o for o in run_overrides(folder) if is_gear(o.lstrip("+~"))]


def is_gear(override: str) -> bool:
    return override.startswith(GEARS_ANYWAY) or not override.startswith(NOT_GEARS)


def natural_order(path: Path) -> list:
    """multirun/2/ before multirun/10/."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in path.parts]


def load_runs(root: Path) -> list[Run]:
    """Every run below `root`, named by the gear overrides that tell it from the others
    (a gear set on the whole sweep's command line is in every name, so in none)."""
    runs = []
    for order, hydra_dir in enumerate(sorted(root.glob("**/.hydra"), key=natural_order)):
        folder = hydra_dir.parent
        summary_file = folder / "summary.json"
        summary = json.loads(summary_file.read_text()) if summary_file.exists() else None
        overrides = run_overrides(folder)
        gears = [o for o in overrides if is_gear(o.lstrip("+~"))]
        rest = tuple(o for o in overrides if o not in gears)
        runs.append(Run(folder, gears, summary, round=rest, order=order))
    if len(runs) > 1:
        shared = set.intersection(*(set(run.gears) for run in runs))
        for run in runs:
            run.gears = [g for g in run.gears if g not in shared]
    return runs


BASELINE_GEARS = ([], ["experiment=baseline"], ["gear=baseline"])


@dataclass
class Config:
    """One configuration of gears and its runs, one a round."""

    name: str
    runs: list[Run]

    @property
    def done(self) -> list[Run]:
        return [r for r in self.runs if not r.failed]

    @property
    def failed(self) -> list[Run]:
        return [r for r in self.runs if r.failed]

    @property
    def median_throughput(self) -> float:
        values = sorted(r.summary["samples_per_sec"] for r in self.done)
        return values[len(values) // 2]


def group(runs: list[Run]) -> list[Config]:
    by_name: dict[str, Config] = {}
    for run in runs:
        by_name.setdefault(run.name, Config(run.name, [])).runs.append(run)
    return list(by_name.values())


def pick_baseline(configs: list[Config]) -> Config | None:
    done = [c for c in configs if c.done]
    plain = [c for c in done if c.runs[0].gears in BASELINE_GEARS]
    return plain[0] if plain else min(done, key=lambda c: c.median_throughput, default=None)


def pairs_with(config: Config, base: Config) -> tuple[list[tuple[dict, dict]], int]:
    """(gear summary, baseline summary) for each finished run of `config`, the baseline
    run being the one of the same round (the nearest in the sweep if the round has
    several); and how many runs found none (their round's baseline run failed)."""
    pairs, unpaired = [], 0
    for run in config.done:
        same_round = [b for b in base.done if b.round == run.round]
        if not same_round:
            unpaired += 1
            continue
        nearest = min(same_round, key=lambda b: abs(b.order - run.order))
        pairs.append((run.summary, nearest.summary))
    return pairs, unpaired


@dataclass
class Reading:
    """The report's content: what its tables, its chart and W&B show."""

    baseline: Effect | None
    ranked: list[Effect]  # faster, the baseline, slower, within noise
    idle: list[Effect]  # did not act
    combos: list[Combination]
    failed: list[tuple[str, Path]]
    baseline_spread: float | None = None
    rounds: int = 0  # the most pairs a configuration has
    devices: list[str] = field(default_factory=list)


def read(runs: list[Run]) -> Reading:
    configs = group(runs)
    base = pick_baseline(configs)
    failed = [(c.name, r.folder) for c in configs for r in c.failed]
    if base is None:
        return Reading(None, [], [], [], failed)
    base_runs = [r.summary for r in base.done]
    effects = [baseline_effect(base.name, base_runs)]
    for config in configs:
        if config is not base and config.done:
            effects.append(measure(config.name, *pairs_with(config, base)))
    effects = ranking(effects)
    mark_same_settings(effects)
    return Reading(
        baseline=next(e for e in effects if e.klass == BASELINE),
        ranked=[e for e in effects if e.klass != DID_NOT_ACT],
        idle=[e for e in effects if e.klass == DID_NOT_ACT],
        combos=combinations(effects),
        failed=failed,
        baseline_spread=run_spread(base_runs),
        rounds=max((e.pairs for e in effects if e.klass != BASELINE), default=0),
        devices=sorted({str(r.summary.get("device", "?")) for c in configs for r in c.done}),
    )


def times(r: Ratio | None, mark_noise: bool = True) -> str:
    """1.22x [1.05, 1.31]; within noise: ≈1.03x [0.97, 1.08]; one pair: ≈1.03x."""
    if r is None:
        return "-"
    mark = "≈" if mark_noise and r.within_noise else ""
    if r.n == 1:
        return f"{mark}{r.median:.2f}x"
    return f"{mark}{r.median:.2f}x [{r.lo:.2f}, {r.hi:.2f}]"


def settings(e: Effect) -> str:
    return ", ".join(f"{k}={shown(new)}" for k, (_, new) in e.acted.items())


def note(e: Effect) -> str:
    if e.klass == BASELINE:
        return "the reference"
    parts = []
    if e.acted:
        parts.append(f"acted: {settings(e)}")
    if e.same_as:
        parts.append(f"the same resolved gears as {e.same_as}")
    if e.klass == NOISE:
        parts.append(rounds_note(e))
        if e.step_time and not e.step_time.within_noise:  # a median: steadier under stalls
            way = "slower" if e.step_time.median > 1 else "faster"
            parts.append(f"its median step time is {way}: {times(e.step_time)}")
    if e.varied_pairs:
        parts.append(f"its gears resolved otherwise in {e.varied_pairs} round(s)")
    if e.idle_pairs:
        parts.append(f"did not act in {e.idle_pairs} round(s): {'; '.join(e.reasons)}")
    if e.unpaired:
        parts.append(f"{e.unpaired} run(s) without a baseline run in their round")
    return "; ".join(parts)


def rounds_note(e: Effect) -> str:
    if e.pairs < 2:
        return f"{e.pairs} pair: no spread to go by, run more rounds"
    if e.rounds_needed > 999:
        return "a 5% effect needs over 999 rounds at this spread"
    if e.rounds_needed <= e.pairs:
        return f"{e.pairs} rounds resolve 5% at this spread: its effect is smaller"
    return f"~{e.rounds_needed} rounds would resolve a 5% effect at this spread"


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


RANKED_COLUMNS = (
    "configuration",
    "class",
    "pairs",
    "samples/s",
    "throughput",
    "step time",
    "peak memory",
    "data wait",
    "loss",
    "note",
)
IDLE_COLUMNS = ("configuration", "pairs", "samples/s", "throughput (same settings)", "why")
COMBO_COLUMNS = ("configuration", "measured", "product of its parts", "parts", "reading")


def ranked_cells(e: Effect) -> list[str]:
    ratios = [e.throughput, e.step_time, e.memory]
    cells = ["1.00x"] * 3 if e.klass == BASELINE else [times(r) for r in ratios]
    return [
        e.name,
        e.klass,
        str(e.pairs),
        fmt(e.samples_per_sec, ",.1f"),
        *cells,
        fmt(e.data_wait_pct, ".1f") + ("%" if e.data_wait_pct is not None else ""),
        fmt(e.final_loss, ".4f"),
        note(e),
    ]


def idle_cells(e: Effect) -> list[str]:
    why = "; ".join(e.reasons) or "the same resolved gears as the baseline"
    return [e.name, str(e.pairs), fmt(e.samples_per_sec, ",.1f"), times(e.throughput, False), why]


def combo_cells(c: Combination) -> list[str]:
    parts = [f"{p.name} {p.throughput.median:.2f}x ({p.klass})" for p in c.parts]
    parts += [f"{k}: not measured alone" for k in c.uncovered]
    product = f"{c.product:.2f}x" + ("" if c.counted else " (no part is an effect)")
    return [c.name, times(c.measured), product, "; ".join(parts), c.reading]


def method(reading: Reading) -> str:
    n = reading.rounds
    here = f" (here: {describe_interval(n)})" if n >= MIN_PAIRS else ""
    lines = [
        "Each gear run is divided by the baseline run of its round (the overrides other than "
        "gears: seed=N in `make ablation`), so that both runs of a pair see the machine "
        "alike. A configuration's figure is the median of its pairs' ratios to the baseline "
        "(throughput above 1.00x: faster; step time and peak memory below 1.00x: less). The "
        "brackets are an interval of that median, no assumption about the noise's shape: "
        "the pairs' min-max below 5 pairs (a 75% interval with 3 pairs, 88% with 4), from 5 "
        "pairs on the narrowest k-th smallest to k-th largest pair that holds the median "
        f"with at least 90% probability{here}. An interval that holds 1.00 is within noise "
        f"(marked ≈); fewer than {MIN_PAIRS} pairs are within noise whatever they show.",
        "Classes come from throughput: faster or slower (an effect), within noise, or did "
        "not act (its resolved gears, summary.json `gears`, equal the baseline's on the "
        "device it ran on).",
    ]
    if reading.baseline_spread is not None:
        lines.append(
            f"The baseline's own runs differ by {100 * reading.baseline_spread:.0f}% "
            "(1 - slowest / fastest): what pairing takes out."
        )
    return "\n\n".join(lines)


def table_md(columns: tuple[str, ...], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]


def markdown(reading: Reading, title: str) -> str:
    lines = [f"# {title}", ""]
    if reading.baseline:
        b = reading.baseline
        lines += [
            f"Baseline: {b.name}, {b.pairs} run(s), median {b.samples_per_sec:,.1f} samples/s "
            f"on {', '.join(reading.devices)}.",
            "",
            "## What each gear bought",
            "",
            *table_md(RANKED_COLUMNS, [ranked_cells(e) for e in reading.ranked]),
            "",
            method(reading),
        ]
    if reading.idle:
        lines += [
            "",
            "## Did not act here",
            "",
            "These resolved to the baseline's settings on this machine, so they are not "
            "ranked: their ratio is two runs of the same settings, the noise itself.",
            "",
            *table_md(IDLE_COLUMNS, [idle_cells(e) for e in reading.idle]),
        ]
    if reading.combos:
        lines += [
            "",
            "## Combinations",
            "",
            "A configuration that switches several gears measured alone, beside the product "
            "of those gears' effects that are not noise: outside its interval, they do not "
            "add up as if alone.",
            "",
            *table_md(COMBO_COLUMNS, [combo_cells(c) for c in reading.combos]),
        ]
    if reading.failed:
        lines += [
            "",
            "## Failed runs",
            "",
            "No summary.json; see train.log and .submitit/ logs:",
            "",
        ]
        lines += [f"- {name}: {folder}" for name, folder in reading.failed]
    return "\n".join(lines) + "\n"


def ratio_json(r: Ratio | None) -> dict | None:
    return None if r is None else {**asdict(r), "within_noise": r.within_noise}


def effect_json(e: Effect) -> dict:
    return {
        "name": e.name,
        "class": e.klass,
        "pairs": e.pairs,
        "samples_per_sec": e.samples_per_sec,
        "throughput": ratio_json(e.throughput),
        "step_time": ratio_json(e.step_time),
        "peak_memory": ratio_json(e.memory),
        "data_wait_pct": e.data_wait_pct,
        "final_loss": e.final_loss,
        "acted": {k: list(v) for k, v in e.acted.items()},
        "did_not_act_because": e.reasons,
        "idle_pairs": e.idle_pairs,
        "varied_pairs": e.varied_pairs,
        "unpaired": e.unpaired,
        "rounds_to_resolve_5pct": e.rounds_needed,
        "same_as": e.same_as,
    }


def as_json(reading: Reading) -> dict:
    return {
        "baseline": reading.baseline.name if reading.baseline else None,
        "devices": reading.devices,
        "interval": describe_interval(reading.rounds) if reading.rounds else None,
        "configurations": [effect_json(e) for e in [*reading.ranked, *reading.idle]],
        "combinations": [
            {
                "name": c.name,
                "measured": ratio_json(c.measured),
                "product": c.product,
                "parts": [p.name for p in c.parts],
                "counted": [p.name for p in c.counted],
                "uncovered": c.uncovered,
                "reading": c.reading,
            }
            for c in reading.combos
        ],
        "failed": [{"name": name, "folder": str(folder)} for name, folder in reading.failed],
    }


def wandb_tables(reading: Reading) -> dict[str, tuple[tuple[str, ...], list[list[str]]]]:
    return {
        "gear_report/effects": (RANKED_COLUMNS, [ranked_cells(e) for e in reading.ranked]),
        "gear_report/did_not_act": (IDLE_COLUMNS, [idle_cells(e) for e in reading.idle]),
        "gear_report/combinations": (COMBO_COLUMNS, [combo_cells(c) for c in reading.combos]),
        "gear_report/failed": (
            ("configuration", "folder"),
            [[n, str(f)] for n, f in reading.failed],
        ),
    }


def wandb_summary(reading: Reading) -> dict[str, object]:
    """Each configuration's class and throughput ratio with its interval, as W&B keys."""
    summary: dict[str, object] = {}
    for e in [*reading.ranked, *reading.idle]:
        summary[f"gear_report/{e.name}/class"] = e.klass
        summary[f"gear_report/{e.name}/pairs"] = e.pairs
        if e.throughput:
            summary[f"gear_report/{e.name}/throughput"] = e.throughput.median
            summary[f"gear_report/{e.name}/throughput_lo"] = e.throughput.lo
            summary[f"gear_report/{e.name}/throughput_hi"] = e.throughput.hi
    summary["gear_report/failed_runs"] = len(reading.failed)
    return summary


STYLE = {FASTER: "green", SLOWER: "red", NOISE: "dim", BASELINE: "bold", DID_NOT_ACT: "dim"}


def print_tables(reading: Reading, title: str) -> None:
    console = Console(width=200)
    sections = [
        (title, RANKED_COLUMNS, [(ranked_cells(e), STYLE[e.klass]) for e in reading.ranked]),
        ("did not act here", IDLE_COLUMNS, [(idle_cells(e), "dim") for e in reading.idle]),
        ("combinations", COMBO_COLUMNS, [(combo_cells(c), None) for c in reading.combos]),
        (
            "failed runs",
            ("configuration", "folder"),
            [([n, str(f)], "red") for n, f in reading.failed],
        ),
    ]
    for name, columns, rows in sections:
        if not rows:
            continue
        table = Table(title=name)
        for column in columns:
            numeric = column in ("pairs", "samples/s", "data wait", "loss")
            table.add_column(column, justify="right" if numeric else "left")
        for cells, style in rows:
            table.add_row(*cells, style=style)
        console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description="Gear report of a sweep folder")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--no-plot", action="store_true", help="no report.png")
    parser.add_argument("--no-wandb", action="store_true", help="nothing to the W&B group")
    args = parser.parse_args()
    if find_spec("hydra_plugins.gearshift_sweeper"):  # the Optuna sweeper, unless deleted
        from hydra_plugins.gearshift_sweeper._report import main as study_report
        from hydra_plugins.gearshift_sweeper._report import study_storage

        if study_storage(args.folder) is not None:  # an Optuna search's folder: its study report
            raise SystemExit(study_report([str(args.folder), *(["--no-plot"] * args.no_plot)]))
    runs = load_runs(args.folder)
    if not runs:
        raise SystemExit(f"error: no run folders (with .hydra/) under {args.folder}")
    reading = read(runs)
    title = f"gear report: {args.folder}"
    (args.folder / "report.md").write_text(markdown(reading, title))
    (args.folder / "report.json").write_text(json.dumps(as_json(reading), indent=2) + "\n")
    chart = None
    if not args.no_plot and reading.baseline:
        from report_chart import plot

        chart = args.folder / "report.png"
        plot(reading, chart, title)
    if not args.no_wandb and reading.baseline:
        from report_wandb import log_to_group

        folders = [r.folder for r in runs]
        log_to_group(args.folder, folders, wandb_tables(reading), wandb_summary(reading), chart)
    print_tables(reading, title)


if __name__ == "__main__":
    main()
