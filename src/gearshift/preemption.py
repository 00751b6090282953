"""Schedulers warn before they kill: SIGTERM (SLURM, Kubernetes, torchrun) or SIGUSR1
(SLURM's --signal). This turns either into a flag the loop checks between steps, so the
run can save a checkpoint and stop cleanly instead of dying mid-step."""

from __future__ import annotations

import signal
import threading

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class TrainingStopped(Exception):
    """Training stopped on a signal after saving a checkpoint; resume=auto continues it."""

    def __init__(self, signum: int, step: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}")
        self.signum, self.step = signum, step


class StopRequest:
    """Context manager: while inside, STOP_SIGNALS set `signum` instead of killing."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():  # signals go to the main thread
            self._previous = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame) -> None:
        self.signum = signum

    def __bool__(self) -> bool:
        return self.signum is not None
