"""Where metrics go besides the console: W&B, TensorBoard, a CSV file, and summary.json.

`logger=` selects the backends, one or several (`logger=[wandb,csv]`); each gets the same
metrics under the same names (train/loss, perf/samples_per_sec, val/..., mem/...) at the
same steps. W&B is online when an API key is configured and offline into the run folder
otherwise (`wandb sync` uploads it later). A backend's failure, at start or mid-run, is
logged once as a warning and training goes on without that backend.
"""

from __future__ import annotations

import csv
import json
import logging
import netrc
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from gearshift.config.schema import LoggerConfig

log = logging.getLogger(__name__)

CSV_COLUMNS = ("step", "name", "value")


def has_wandb_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc().authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def wandb_mode(configured: str) -> str:
    if configured != "auto":
        return configured
    if os.environ.get("WANDB_MODE"):  # the user's own W&B setting wins over our guess
        return os.environ["WANDB_MODE"]
    return "online" if has_wandb_api_key() else "offline"


class NullLogger:
    """The logger interface; this one keeps nothing (ranks other than 0 hold it)."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        pass

    def finish(self, summary: dict[str, Any] | None = None) -> None:
        pass

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        """A table (the profiler's operators); a backend without tables ignores it."""

    def log_file(self, path: Path, name: str, kind: str) -> None:
        """A file worth keeping with the run (the profiler's trace); W&B uploads it online."""

    def log_text(self, key: str, texts: list[str], step: int) -> None:
        """Texts of one step (task=lm's samples), each backend in its own form."""


class Backend(NullLogger):
    """One backend. Its first failure, at start or later, is one warning and turns it off
    for the rest of the run: a logger never ends a run."""

    label = "logger"

    def __init__(self, start: Callable[[], None]) -> None:
        self.on = True
        try:
            start()
        except Exception as error:
            log.warning("%s is off for this run: %s", self.label, error)
            self.on = False

    def _guarded(self, action: str, fn: Callable[[], None]) -> None:
        if not self.on:
            return
        try:
            fn()
        except Exception as error:
            log.warning("%s %s failed, going on without it: %s", self.label, action, error)
            self.on = False

    def finish(self, summary: dict[str, Any] | None = None) -> None:
        self._guarded("finish", lambda: self.close(summary))
        self.on = False

    def close(self, summary: dict[str, Any] | None) -> None:
        pass


class WandbLogger(Backend):
    label = "W&B"

    def __init__(self, cfg: LoggerConfig, run_dir: Path, config: dict, name: str | None) -> None:
        self.run = None
        mode = self.mode = wandb_mode(cfg.mode)

        def start() -> None:
            import wandb

            self.run = wandb.init(
                project=cfg.project,
                entity=cfg.entity,
                group=cfg.group,
                tags=list(cfg.tags),
                name=name,
                dir=str(run_dir),
                config=config,
                mode=mode,
                settings=wandb.Settings(console="off", quiet=True),
            )
            # offline runs get no name until synced; their id names the folder to sync
            log.info("W&B run %s (%s)", self.run.name or self.run.id, mode)

        super().__init__(start)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._guarded("log", lambda: self.run.log(metrics, step=step))

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        def send() -> None:
            import wandb

            self.run.log({key: wandb.Table(columns=columns, data=rows)}, step=step)

        self._guarded("table", send)

    def log_text(self, key: str, texts: list[str], step: int) -> None:
        # one row per text; the step is a column too, so the tables of several steps compare
        self.log_table(
            key, ["step", "index", "text"], [[step, i, t] for i, t in enumerate(texts)], step
        )

    def log_file(self, path: Path, name: str, kind: str) -> None:
        if self.mode != "online":  # offline, the file is in the run folder already
            return

        def upload() -> None:
            import wandb

            artifact = wandb.Artifact(name, type=kind)
            artifact.add_file(str(path))
            self.run.log_artifact(artifact)

        self._guarded("artifact", upload)

    def close(self, summary: dict[str, Any] | None) -> None:
        self.run.summary.update(summary or {})
        self.run.finish()


class TensorBoardLogger(Backend):
    """Scalars into `folder` (`tensorboard --logdir runs`), one tag per metric name."""

    label = "TensorBoard"

    def __init__(self, folder: Path, start_step: int) -> None:
        def start() -> None:
            from torch.utils.tensorboard import SummaryWriter

            # The run logs steps after start_step: TensorBoard drops what an earlier run in
            # this folder logged there (a resumed run's checkpoint is at start_step), so no
            # step shows twice.
            self.writer = SummaryWriter(str(folder), purge_step=start_step + 1)

        super().__init__(start)

    def log(self, metrics: dict[str, float], step: int) -> None:
        def write() -> None:
            for name, value in metrics.items():
                if value is not None:
                    self.writer.add_scalar(name, value, step)
            self.writer.flush()  # log steps are few: a killed run keeps what it logged

        self._guarded("log", write)

    def log_text(self, key: str, texts: list[str], step: int) -> None:
        def write() -> None:
            # TensorBoard renders markdown: each text as a code block keeps its line breaks
            blocks = [f"**{i}**\n\n```\n{text}\n```" for i, text in enumerate(texts)]
            self.writer.add_text(key, "\n\n".join(blocks), step)
            self.writer.flush()

        self._guarded("text", write)

    def close(self, summary: dict[str, Any] | None) -> None:
        self.writer.close()


class CsvLogger(Backend):
    """`path` in long format, one `step,name,value` row per metric and logged step.

    A metric that first appears late (val/... at the first validation) is just more rows,
    so the file never needs a new header. Each log step's rows are flushed, so a killed
    run keeps them. A resumed run keeps the rows up to its checkpoint's step, drops those
    the interrupted run logged after it (it logs them again) and appends.
    """

    label = "CSV"

    def __init__(self, path: Path, start_step: int) -> None:
        def start() -> None:
            kept = _csv_rows_up_to(path, start_step) if path.exists() else []
            tmp = path.with_name(f".{path.name}.tmp")
            with tmp.open("w", newline="") as file:
                csv.writer(file).writerows([CSV_COLUMNS, *kept])
            os.replace(tmp, path)  # whole or not at all
            self.file = path.open("a", newline="")
            self.writer = csv.writer(self.file)

        super().__init__(start)

    def log(self, metrics: dict[str, float], step: int) -> None:
        def write() -> None:
            self.writer.writerows(
                (step, name, value) for name, value in metrics.items() if value is not None
            )
            self.file.flush()

        self._guarded("log", write)

    def log_text(self, key: str, texts: list[str], step: int) -> None:
        def write() -> None:  # `key/i` rows whose value is the text (csv quotes line breaks)
            self.writer.writerows((step, f"{key}/{i}", text) for i, text in enumerate(texts))
            self.file.flush()

        self._guarded("text", write)

    def close(self, summary: dict[str, Any] | None) -> None:
        self.file.close()


def _csv_rows_up_to(path: Path, step: int) -> list[list[str]]:
    """The complete rows of an earlier metrics.csv up to `step` (a run killed while
    writing may have left half a line at the end: it is dropped)."""
    text = path.read_text()
    complete = text[: text.rfind("\n") + 1]
    rows = list(csv.reader(complete.splitlines()))[1:]  # after the header
    return [row for row in rows if len(row) == len(CSV_COLUMNS) and int(row[0]) <= step]


class Loggers(NullLogger):
    """Every selected backend gets every call."""

    def __init__(self, backends: list[NullLogger]) -> None:
        self.backends = backends

    def log(self, metrics: dict[str, float], step: int) -> None:
        for backend in self.backends:
            backend.log(metrics, step)

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        for backend in self.backends:
            backend.log_table(key, columns, rows, step)

    def log_file(self, path: Path, name: str, kind: str) -> None:
        for backend in self.backends:
            backend.log_file(path, name, kind)

    def log_text(self, key: str, texts: list[str], step: int) -> None:
        for backend in self.backends:
            backend.log_text(key, texts, step)

    def finish(self, summary: dict[str, Any] | None = None) -> None:
        for backend in self.backends:
            backend.finish(summary)


def build_logger(
    cfg: LoggerConfig,
    run_dir: Path,
    config: dict,
    name: str | None,
    start_step: int = 0,
    enabled: bool = True,
) -> NullLogger:
    """The backends `cfg` (the logger node) selects; `start_step`: the step a resumed run
    continues from (0 for a new one). Not `enabled` (ranks other than 0): none."""
    if not enabled:
        return NullLogger()
    backends: list[NullLogger] = []
    if cfg.wandb and cfg.mode != "disabled":
        backends.append(WandbLogger(cfg, run_dir, config, name))
    if cfg.tensorboard:
        backends.append(TensorBoardLogger(run_dir / "tensorboard", start_step))
    if cfg.csv:
        backends.append(CsvLogger(run_dir / "metrics.csv", start_step))
    return Loggers(backends)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write to a temporary file and rename it over `path`: readers never see half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
