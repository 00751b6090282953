"""The training loss, kept per optimizer step on the device between log steps and checked
for NaN and inf when it is read, at no extra sync (docs/gears.md, "on_nonfinite=stop|skip").
The terms a task's loss returns beside it (Task.loss_terms) share its row.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor

from gearshift.config import ConfigError
from gearshift.parallel.distributed import gather_sum_max

NONE = 2**62  # "no non-finite step" where ranks agree on the first one (a max of -step)


class LossWatch:
    def __init__(self, device: torch.device, steps_between_reads: int) -> None:
        self.device = device
        # One row per step: the loss, then the task's logged terms (Task.loss_terms) in the
        # order of `names`, which the first `add` sets.
        self.names: list[str] | None = None
        self.losses = torch.zeros(max(steps_between_reads, 1), 1, device=device)
        self.first = 0  # the step number of slot 0 (set by the first `add` after a read)
        self.used = 0  # slots filled since the last read
        self.skipped = 0  # on_nonfinite=skip: steps whose update was skipped, whole run
        self.skipped_since_read = 0

    def add(
        self, loss: torch.Tensor, step: int, terms: dict[str, torch.Tensor] | None = None,
        window: int = 1,
    ) -> None:  # fmt: skip
        """A micro-batch's detached loss (already divided by its window's length, `window`,
        for the gradients) of optimizer step `step`, and the terms the task logs beside it,
        divided by `window` here: a step's row sums to its mean of each. Device work only."""
        terms = terms or {}
        if self.names is None:
            self.names = list(terms)
            self.losses = torch.zeros(len(self.losses), 1 + len(terms), device=self.device)
        elif list(terms) != self.names:
            raise ConfigError(
                f"the task's loss returned the terms {list(terms)}, its first call {self.names}: "
                "return the same names every call"
            )
        if self.used == 0:
            self.first = step
        slot = step - self.first
        if slot >= len(self.losses):  # more steps between reads than foreseen: grow, no sync
            self.losses = torch.cat([self.losses, torch.zeros_like(self.losses)])
        if terms:  # one row, one in-place add
            logged = torch.stack([term.detach().float() for term in terms.values()]) / window
            loss = torch.cat([loss.float().view(1), logged])
        self.losses[slot].add_(loss)
        self.used = slot + 1

    def update_allowed(self) -> bool:
        """At the end of an accumulation window: whether its update goes ahead. Always here;
        on_nonfinite=skip's watch (loss_skip.py) says no after a NaN/inf loss."""
        return True

    def _read(self, extra: list[torch.Tensor]) -> tuple[list[list[float]], int | None, list[float]]:
        """(each step's row, the first step whose loss was not finite or None, the `extra`
        scalars' values): one host read."""
        rows = self.losses[: self.used]
        values = torch.cat([rows.double().flatten(), *(t.double().view(1) for t in extra)]).tolist()
        width, cut = rows.shape[1], rows.numel()
        steps = [values[i : i + width] for i in range(0, cut, width)]
        bad = next((i for i, row in enumerate(steps) if not math.isfinite(row[0])), None)
        return steps, None if bad is None else self.first + bad, values[cut:]

    def read(
        self, extra: list[torch.Tensor]
    ) -> tuple[dict[str, float], int | None, int, list[float]]:
        """At a log step: (the sums since the last read of the loss and of each logged term,
        {"loss": ..., name: ...}; the first step whose loss was not finite or None; the
        steps skipped since the last read; the values of the `extra` scalars). One host
        read for all of them."""
        steps, first_bad, values = self._read(extra)
        self.losses[: self.used].zero_()
        self.used = 0
        skipped, self.skipped_since_read = self.skipped_since_read, 0
        names = ["loss", *(self.names or [])]
        sums = {name: math.fsum(row[i] for row in steps) for i, name in enumerate(names)}
        return sums, first_bad, skipped, values

    def metrics(self) -> dict[str, int]:
        """What a log step reports beside the losses: none here (loss_skip.py: steps skipped)."""
        return {}

    def check(self, parameters: Iterable[torch.Tensor]) -> tuple[int | None, bool]:
        """Before a checkpoint: (the first step since the last read whose loss was not
        finite or None, whether every weight is finite), agreed over ranks. One read and
        one small collective, a checkpoint's only."""
        finite = [
            torch.isfinite(p.to_local() if isinstance(p, DTensor) else p).all()  # FSDP: a shard
            for p in parameters
        ]
        weights = torch.stack(finite).all() if finite else torch.ones((), dtype=torch.bool)
        _, first_bad, (weights_finite,) = self._read([weights.to(self.device)])
        _, (first_bad, unhealthy) = gather_sum_max(
            [],
            [-(NONE if first_bad is None else first_bad), float(not weights_finite)],
            self.device,
        )  # the max of -step over ranks is the first bad step
        return (int(-first_bad) if first_bad > -NONE else None), not unhealthy
