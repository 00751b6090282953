"""The report of a study: `study_report.md` in the sweep folder, with the best trial, the
trial table (state, params, objective, steps trained, pruned at, and why a failed trial
failed) and two plots by Optuna's matplotlib visualisers (`optimization_history.png`,
`param_importances.png`).

Each trial shows as it is: one the storage still holds as running whose run ended with its
summary.json (its sweep was killed before it told the study) shows complete (or pruned),
with that summary's objective.

The sweeper writes it when the sweep ends; for a sweep folder by hand (a study still running,
one that was killed): `make report DIR=<sweep dir>` (scripts/report.py hands a study's
folder to this module) or `python -m hydra_plugins.gearshift_sweeper._report <sweep dir>`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from pathlib import Path
from typing import Any, NamedTuple

from hydra_plugins.gearshift_sweeper._study_reporter import FAILURE, PRUNED_AT

log = logging.getLogger(__name__)

SWEEPER = "gearshift_sweeper.sweeper.OptunaSweeper"  # the _target_ of a study's sweep


def write_report(study: Any, sweep_dir: Path, plots: bool = True) -> Path:
    """study_report.md (and the plots, `plots`) in `sweep_dir`; returns the report's path."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    rows = [seen(t, sweep_dir) for t in trials]
    keys = sorted({key for t in trials for key in t.params})
    lines = [f"# Study {study.study_name}", ""]
    direction = study.direction.name.lower()
    states = {s.name.lower(): sum(row.state == s.name.lower() for row in rows) for s in TrialState}
    counted = ", ".join(f"{n} {s}" for s, n in states.items() if n)
    lines += [f"{len(trials)} trials ({counted}); direction: {direction}.", ""]
    done = [row for row in rows if row.state == "complete"]
    if done:
        pick = max if direction == "maximize" else min
        best = pick(done, key=lambda row: row.value)
        chosen = ", ".join(f"{k}={v}" for k, v in best.trial.params.items())
        lines += [f"Best: trial {best.trial.number}, value {best.value:.6g} ({chosen}).", ""]
    failures = any(row.failure for row in rows)  # the column only when a trial failed
    lines += [
        "| trial | state | " + " | ".join(keys) + " | value | steps | pruned at |"
        + " failure |" * failures,
        "|---|---|" + "---|" * len(keys) + "---|---|---|" + "---|" * failures,
    ]  # fmt: skip
    for row in rows:
        t = row.trial
        params = " | ".join(_cell(t.params.get(k)) for k in keys)
        value = "" if row.value is None else f"{row.value:.6g}"
        pruned_at = _cell(t.user_attrs.get(PRUNED_AT))
        cells = f"| {t.number} | {row.state} | {params} | {value} | "
        cells += f"{_cell(steps_trained(sweep_dir, t.number))} | {pruned_at} |"
        lines.append(cells + f" {row.failure.replace('|', '/')} |" * failures)
    if plots:
        lines += ["", *write_plots(study, sweep_dir, complete)]
    path = sweep_dir / "study_report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


class Seen(NamedTuple):
    """A trial as the report shows it."""

    trial: Any  # the storage's FrozenTrial
    state: str  # complete, pruned, fail, running, ...
    value: float | None
    failure: str  # why it failed ("" unless it did)


def seen(trial: Any, sweep_dir: Path) -> Seen:
    """`trial` as it is: the storage's state and value, except for a trial the storage
    holds as running whose run folder no process holds and whose summary.json exists: it
    ended while no sweep told the study (the sweep was killed), complete or pruned, with
    its summary's objective (what a rerun counts it as)."""
    from optuna.trial import TrialState

    from gearshift.app import objective
    from gearshift.state.run_lock import holder

    failure = str(trial.user_attrs.get(FAILURE, ""))
    state = trial.state.name.lower()
    run_dir = sweep_dir / str(trial.number)
    summary = run_dir / "summary.json"
    if trial.state != TrialState.RUNNING or holder(run_dir) is not None or not summary.is_file():
        return Seen(trial, state, trial.value, failure)
    ended = json.loads(summary.read_text())
    if ended.get("stop_reason") == "pruned":
        return Seen(trial, "pruned", None, failure)
    return Seen(trial, "complete", objective(ended), failure)


def steps_trained(sweep_dir: Path, number: int) -> int | None:
    """The optimizer steps trial `number`'s run trained (its summary.json), if it ended."""
    summary = sweep_dir / str(number) / "summary.json"
    return json.loads(summary.read_text())["steps"] if summary.is_file() else None


def write_plots(study: Any, sweep_dir: Path, complete: list[Any]) -> list[str]:
    """The plots Optuna can draw of this study; the report's lines that show them."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a cluster node
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as plots

    lines = []
    wanted = [("optimization_history", plots.plot_optimization_history, 1)]
    wanted.append(("param_importances", plots.plot_param_importances, 2))
    for name, plot, needs in wanted:
        (sweep_dir / f"{name}.png").unlink(missing_ok=True)  # no stale plot of an earlier report
        if len(complete) < needs:
            lines.append(f"({name}: needs {needs} completed trials)")
            continue
        if name == "param_importances" and len({t.value for t in complete}) == 1:
            # every importance estimator splits a zero variance evenly: a chart of nothing
            lines.append(f"({name}: no parameter changed the objective; every completed "
                         f"trial scored {complete[0].value:.6g})")  # fmt: skip
            continue
        try:
            with warnings.catch_warnings():  # Optuna marks its matplotlib plots experimental
                warnings.simplefilter("ignore")
                axes = plot(study)
        except (ValueError, RuntimeError) as error:  # e.g. a single value everywhere
            lines.append(f"({name}: {error})")
            continue
        axes.figure.savefig(sweep_dir / f"{name}.png", dpi=100, bbox_inches="tight")
        plt.close(axes.figure)
        lines.append(f"![{name}]({name}.png)")
    return lines


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def study_storage(sweep_dir: Path) -> str | None:
    """Where the study of a sweep folder lives: the storage its sweep was run with
    (multirun.yaml, which Hydra writes into the folder), else `<sweep dir>/study.journal`;
    None for a folder that is no study's (a gear ablation's)."""
    import yaml

    sweeper: dict[str, Any] = {}
    multirun = sweep_dir / "multirun.yaml"
    if multirun.is_file():
        hydra = (yaml.safe_load(multirun.read_text()) or {}).get("hydra") or {}
        sweeper = hydra.get("sweeper") or {}
    storage = str(sweeper.get("storage") or "${")  # "${": none given, or not resolvable here
    ours = SWEEPER in str(sweeper.get("_target_")) and "${" not in storage
    if ours and ("://" in storage or Path(storage).is_file()):
        return storage
    journal = sweep_dir / "study.journal"
    return str(journal) if journal.is_file() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--study", help="the study's name (default: the only one)")
    parser.add_argument("--no-plot", action="store_true", help="the table only")
    args = parser.parse_args(argv)
    storage_url = study_storage(args.sweep_dir)
    if storage_url is None:
        print(f"error: {args.sweep_dir} holds no study (no study.journal, no multirun.yaml "
              "of a gearshift_optuna sweep)", file=sys.stderr)  # fmt: skip
        return 2
    import optuna

    from hydra_plugins.gearshift_sweeper._study import open_storage

    storage = open_storage(storage_url)
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    name = args.study or (names[0] if len(names) == 1 else None)
    if name not in names:
        print(f"error: --study={args.study!r} is not allowed; choose one of: {', '.join(names)}",
              file=sys.stderr)  # fmt: skip
        return 2
    study = optuna.load_study(study_name=name, storage=storage)
    print(write_report(study, args.sweep_dir, plots=not args.no_plot))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
