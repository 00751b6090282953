"""Stop signals as a flag the loop checks between steps, so the run saves a checkpoint and
stops cleanly instead of dying mid-step (which signals, and why: docs/checkpoints.md and
docs/distributed.md, "Stopping a run of several ranks"). Whoever handled the signal before
(submitit requeues the SLURM job from its handler) gets it once the checkpoint is saved:
`TrainingStopped.handover`. A single process keeps Python's KeyboardInterrupt on SIGINT.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
RANK_STOP_SIGNALS = (*STOP_SIGNALS, signal.SIGINT)  # one rank of several

Handler = Callable[[int, object], object]


@dataclass(eq=False)
class TrainingStopped(Exception):
    """Training stopped on a signal after saving a checkpoint; resume=auto continues it.
    `step` None: the process stopped before a rank could save (the local launcher's ranks
    were killed, or never reached training); `checkpoint` is then the newest."""

    signum: int
    step: int | None
    checkpoint: Path | None = None  # what this process saved (rank 0 saves for all)
    handover: Handler | None = None  # the signal's previous Python handler, to call after saving

    def __str__(self) -> str:
        when = f"after step {self.step}" if self.step is not None else "before the ranks saved"
        return f"stopped by {signal.Signals(self.signum).name} {when}"


class StopRequest:
    """Context manager: while inside, `signals` (STOP_SIGNALS; a rank of several:
    RANK_STOP_SIGNALS) set `signum` instead of killing."""

    def __init__(self, signals: tuple[int, ...] = STOP_SIGNALS) -> None:
        self.signals = signals
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    @classmethod
    def for_ranks(cls, world_size: int) -> StopRequest:
        """What stops a run with a checkpoint; Ctrl-C too for a rank of several."""
        return cls(RANK_STOP_SIGNALS if world_size > 1 else STOP_SIGNALS)

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():  # signals go to the main thread
            self._previous = {s: signal.signal(s, self._handle) for s in self.signals}
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame) -> None:
        self.signum = signum

    def __bool__(self) -> bool:
        return self.signum is not None

    def stopped(self, step: int, checkpoint: Path | None) -> TrainingStopped:
        """The exception that ends training; a rank told by the others stops as on SIGTERM."""
        signum = self.signum or signal.SIGTERM
        previous = self._previous.get(signum)
        return TrainingStopped(signum, step, checkpoint, previous if callable(previous) else None)
