"""Several backends at once (`logger=[wandb,csv]`): every call goes to each. Loaded when a
run's `logger=` selects more than one (loggers.py `build_logger`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
