"""Tasks that break on purpose at a chosen training step, for the failure tests.

Importable in-process (pytest puts tests/ on the path) and by train.py subprocesses
(PYTHONPATH=tests): `task._target_=injected.NaNLossAt +task.at_step=3`.
"""

from __future__ import annotations

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
