"""What a person watching sees: a progress bar with live throughput, a table at the end."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table


class ProgressBar:
    """The training bar (rank 0's, `progress_bar`): steps done, samples/s and the loss,
    redrawn at log steps only (no background refresh: it costs nothing between them)."""

    def __init__(self, enabled: bool, total: int, completed: int) -> None:
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[samples_per_sec]:>9,.0f} samples/s"),
            TextColumn("loss {task.fields[loss]:.4f}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            auto_refresh=False,
            disable=not enabled,
        )
        self.bar = self.progress.add_task(
            "train", total=total, completed=completed, samples_per_sec=0.0, loss=math.nan
        )

    def __enter__(self) -> ProgressBar:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def update(self, step: int, samples_per_sec: float, loss: float) -> None:
        self.progress.update(self.bar, completed=step, samples_per_sec=samples_per_sec, loss=loss)
        self.progress.refresh()


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def print_summary(summary: dict[str, Any], console: Console | None = None) -> None:
    table = Table(title="gearshift run", show_header=False, title_justify="left")
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    mib = summary["peak_memory_bytes"] / 2**20
    tokens = []
    if "tokens_per_sec" in summary:  # a task whose samples are tokens
        from gearshift.observe.token_rates import token_rows

        tokens = token_rows(summary, _fmt)
    rows = [
        ("samples/s", _fmt(summary["samples_per_sec"])),
        ("samples/s per device", _fmt(summary["samples_per_sec_per_device"])),
        *tokens,
        ("step time (median)", f"{summary['step_time_ms']:.2f} ms"),
        ("data wait", f"{summary['data_wait_pct']:.1f} %"),
        ("MFU", f"{summary['mfu']:.1%}" if summary.get("mfu") is not None else "n/a"),
        (f"peak memory ({summary['peak_memory_kind']})", f"{mib:,.0f} MiB"),
        ("final loss", _fmt(summary["final_loss"])),
        ("steps / samples", f"{summary['steps']} / {summary['samples']:,}"),
        ("device x world size", f"{summary['device']} x {summary['world_size']}"),
    ]
    rows += [  # the task's validation metrics
        (key.removeprefix("val_").replace("_", " ") + " (val)", _fmt(value))
        for key, value in summary.items()
        if key.startswith("val_")
    ]
    shown = [f"{k}={v}" for k, v in summary["gears"].items() if not k.endswith("_reason")]
    rows.append(("gears", ", ".join(shown)))  # the reasons are in the log instead
    for name, value in rows:
        table.add_row(name, value)
    (console or Console()).print(table)
