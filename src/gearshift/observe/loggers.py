"""Where metrics go besides the console (docs/observing.md, "Loggers"): the backends
`logger=` selects, one or several, each loaded only then, and summary.json's atomic write.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gearshift.config.schema import LoggerConfig
from gearshift.observe.logger_backend import NullLogger


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
    # each backend's module loads only in a run that selects it
    backends: list[NullLogger] = []
    if cfg.wandb and cfg.mode != "disabled":
        from gearshift.observe.wandb_logger import WandbLogger

        backends.append(WandbLogger(cfg, run_dir, config, name))
    if cfg.tensorboard:
        from gearshift.observe.tensorboard_logger import TensorBoardLogger

        backends.append(TensorBoardLogger(run_dir / "tensorboard", start_step))
    if cfg.csv:
        from gearshift.observe.csv_logger import CsvLogger

        backends.append(CsvLogger(run_dir / "metrics.csv", start_step))
    return Loggers(backends)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write to a temporary file and rename it over `path`: readers never see half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
