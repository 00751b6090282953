"""The logger interface (`NullLogger`). Each backend has its own module (wandb_logger.py,
tensorboard_logger.py, csv_logger.py), imported only by a run whose `logger=` names it
(loggers.py `build_logger`), on what they share (guarded_backend.py `Backend`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


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
