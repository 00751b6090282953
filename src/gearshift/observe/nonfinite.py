"""The training loss, summed on the device between log steps and watched for NaN and inf.

`on_nonfinite=stop` (the default) costs no host read: the first optimizer step whose loss
was not finite is kept on the device (`torch.where`, `torch.minimum`) and read together
with the loss at the next log step. `on_nonfinite=skip` decides at every optimizer step
whether to skip its update, so it reads one flag per step (under DDP all ranks agree on it
through one small collective), as fp16's GradScaler does for its own skips.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor

from gearshift.parallel.distributed import gather_sum_max

NONE = 2**62  # "no non-finite step yet"; exact as a float64, like every step number below 2**53


class LossWatch:
    def __init__(self, mode: str, device: torch.device) -> None:
        self.skip = mode == "skip"
        self.device = device
        self.sum = torch.zeros((), device=device)  # the counted steps' losses since the last read
        self.first_bad = torch.full((), NONE, dtype=torch.int64, device=device)  # stop mode
        self.window = torch.zeros((), device=device)  # skip mode: this accumulation window's loss
        self.skipped = 0  # skip mode: steps whose update was skipped, whole run
        self.skipped_since_read = 0

    def add(self, loss: torch.Tensor, step: int) -> None:
        """A micro-batch's (detached) loss, of optimizer step `step`; device work only."""
        if self.skip:
            self.window += loss
            return
        self.sum += loss
        bad_step = torch.where(torch.isfinite(loss), NONE, step)
        torch.minimum(self.first_bad, bad_step, out=self.first_bad)

    def update_allowed(self) -> bool:
        """At the end of an accumulation window: False when skip mode skips its update.

        Skip mode only: one host read (and under DDP one collective), so every rank skips
        the same steps. A skipped window's loss is left out of the logged loss."""
        if not self.skip:
            return True
        bad = float(not torch.isfinite(self.window))
        _, (bad,) = gather_sum_max([], [bad], self.device)
        if bad:
            self.skipped += 1
            self.skipped_since_read += 1
        else:
            self.sum += self.window
        self.window.zero_()
        return not bad

    def read(self, extra: list[torch.Tensor]) -> tuple[float, int | None, int, list[float]]:
        """At a log step: (the loss summed since the last read, the first step whose loss
        was not finite or None, the steps skipped since the last read, the values of the
        `extra` scalars). One host read for all of them."""
        readings = [self.sum, self.first_bad, *extra]
        total, first_bad, *values = torch.stack([t.double() for t in readings]).tolist()
        self.sum.zero_()
        skipped, self.skipped_since_read = self.skipped_since_read, 0
        return total, None if first_bad >= NONE else int(first_bad), skipped, values

    def check(self, parameters: Iterable[torch.Tensor]) -> tuple[int | None, bool]:
        """Before a checkpoint: (the first step whose loss was not finite or None, whether
        every weight this rank holds is finite). One read, a checkpoint's only; the caller
        agrees on it over ranks."""
        finite = [
            torch.isfinite(p.to_local() if isinstance(p, DTensor) else p).all()  # FSDP: a shard
            for p in parameters
        ]
        weights = torch.stack(finite).all() if finite else torch.ones((), dtype=torch.bool)
        first_bad, weights_finite = torch.stack(
            [self.first_bad.double(), weights.to(self.first_bad.device).double()]
        ).tolist()
        return (None if first_bad >= NONE else int(first_bad)), bool(weights_finite)
