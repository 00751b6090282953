"""What each logger backend shares (`Backend`): its first failure, at start or mid-run, is
one warning and turns it off. Loaded with the first backend a run's `logger=` names.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from gearshift.observe.logger_backend import NullLogger

log = logging.getLogger(__name__)


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
