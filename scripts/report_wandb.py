"""The gear report in the sweep's W&B group (scripts/report.py): one run named "gear report"
beside the sweep's runs, holding the report's tables, its chart and each configuration's
figures in its summary. Its settings are the runs' own (logger.* in their .hydra/config.yaml),
so it goes where they went: online, or offline into <sweep folder>/wandb."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from gearshift.observe.wandb_logger import wandb_mode


def logger_settings(run_folder: Path) -> dict[str, Any] | None:
    """The W&B settings a run used, with its group as the run had it (logger.group, else
    the sweep folder's name: gearshift.app.wandb_group); None if it did not log to W&B."""
    config_file = run_folder / ".hydra" / "config.yaml"
    if not config_file.exists():
        return None
    logger = (yaml.safe_load(config_file.read_text()) or {}).get("logger") or {}
    if not logger.get("wandb"):
        return None
    mode = wandb_mode(str(logger.get("mode", "auto")))
    if mode == "disabled":
        return None
    group = logger.get("group")
    if not group:
        hydra_file = run_folder / ".hydra" / "hydra.yaml"
        hydra = yaml.safe_load(hydra_file.read_text()) if hydra_file.exists() else {}
        sweep_dir = ((hydra or {}).get("hydra") or {}).get("sweep", {}).get("dir")
        group = Path(sweep_dir).name if sweep_dir else run_folder.parent.name
    return {
        "project": logger.get("project", "gearshift"),
        "entity": logger.get("entity"),
        "group": group,
        "tags": list(logger.get("tags") or []),
        "mode": mode,
    }


def log_report(
    folder: Path,
    settings: dict[str, Any],
    tables: dict[str, tuple[list[str], list[list[str]]]],
    summary: dict[str, Any],
    chart: Path | None,
) -> str:
    """One W&B run in the sweep's group: `tables` ({key: (columns, rows)}), the chart, and
    `summary` in its summary. Returns where it went."""
    import wandb

    run = wandb.init(
        **settings,
        name="gear report",
        job_type="report",
        dir=str(folder),
        settings=wandb.Settings(console="off", quiet=True, silent=True),
    )
    try:
        logged: dict[str, Any] = {
            key: wandb.Table(columns=list(columns), data=rows)
            for key, (columns, rows) in tables.items()
            if rows
        }
        if chart is not None and chart.exists():
            logged["gear_report/chart"] = wandb.Image(str(chart))
        run.log(logged)
        run.summary.update(summary)
        return f"W&B run {run.id} in group {settings['group']} ({settings['mode']})"
    finally:
        run.finish()


def log_to_group(folder, run_folders, tables, summary, chart) -> None:
    """log_report with the settings of the first run that logged to W&B; a failure is one
    line on stderr, never the report's end (the files are written already)."""
    settings = next(filter(None, map(logger_settings, run_folders)), None)
    if settings is None:
        return
    try:
        print(log_report(folder, settings, tables, summary, chart))
    except Exception as error:
        print(f"warning: the W&B report failed, the files stand: {error}", file=sys.stderr)
