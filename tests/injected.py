"""Tasks that break on purpose at a chosen training step, for the failure tests.

Importable in-process (pytest puts tests/ on the path) and by train.py subprocesses
(PYTHONPATH=tests): `task._target_=injected.NaNLossAt +task.at_step=3`.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torchmetrics import Metric

from gearshift.tasks import Classification


class _BreaksAt(Classification):
    """Classification whose loss misbehaves at optimizer step `at_step` (1-based, accum=1).
    The FLOP count (observe/mfu.py) calls `loss` once before training: call 1 is that one."""

    def __init__(self, at_step: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.at_step, self.calls = at_step, 0

    def loss(self, model, batch):
        loss = super().loss(model, batch)
        self.calls += 1
        return self.break_(loss) if self.calls == self.at_step + 1 else loss


class NaNLossAt(_BreaksAt):
    """The loss of step `at_step` is NaN (and so are that step's gradients)."""

    def break_(self, loss):
        return loss * float("nan")


class OutOfMemoryAt(_BreaksAt):
    """Step `at_step` raises torch's out-of-memory error, as CUDA's allocator does."""

    def break_(self, loss):
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has ..."
        )


class AllocatesTooMuchAt(_BreaksAt):
    """Step `at_step` asks the device for 1 PiB: a real out-of-memory error on CUDA."""

    def break_(self, loss):
        return loss + torch.empty(2**50, dtype=torch.uint8, device=loss.device).sum()


class ScriptedTrial(Classification):
    """A trial of a scripted study (tests/test_optuna_sweeper.py): the loss of step `nan_at`
    is NaN; at step `pause_at` the run writes `<cwd>/paused` and waits until `<cwd>/go`
    exists, once (a run that finds `go` already there goes on: a resumed one). 0: neither."""

    def __init__(self, nan_at: int = 0, pause_at: int = 0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.nan_at, self.pause_at, self.calls = nan_at, pause_at, 0

    def loss(self, model, batch):
        loss = super().loss(model, batch)
        self.calls += 1  # call 1: the FLOP count's, before training
        step = self.calls - 1
        if self.pause_at and step == self.pause_at and not Path("go").exists():
            Path("paused").touch()
            while not Path("go").exists():
                time.sleep(0.01)
        return loss * float("nan") if self.nan_at and step == self.nan_at else loss


class BreaksOnRealData(Metric):
    """A metric that computes on the start's example batch (2 samples) and raises on a real
    validation: the failure of a user's own code after training began."""

    def __init__(self) -> None:
        super().__init__()
        self.add_state("seen", torch.tensor(0), dist_reduce_fx="sum")

    def update(self, predictions, targets) -> None:
        self.seen += len(targets)

    def compute(self) -> torch.Tensor:
        if self.seen > 2:
            raise ValueError("the metric broke")
        return self.seen.float()
