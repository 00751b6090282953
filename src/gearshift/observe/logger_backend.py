"""The logger interface (`NullLogger`) and what every backend shares (`Backend`); loggers.py
builds the backends `logger=` names."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


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
