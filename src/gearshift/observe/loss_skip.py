"""`on_nonfinite=skip`: the loss watch that skips a step's update after a NaN/inf loss.

It decides at every optimizer step, so it reads one flag per step (under DDP all ranks
agree on it through one small collective), as fp16's GradScaler does for its own skips.
Loaded only under on_nonfinite=skip.
"""

from __future__ import annotations

import torch

from gearshift.observe.loss_watch import LossWatch
from gearshift.parallel.distributed import gather_sum_max


class SkippingLossWatch(LossWatch):
    def update_allowed(self) -> bool:
        """At the end of an accumulation window: False when its loss was not finite. One
        host read (and under DDP one collective), so every rank skips the same steps. A
        skipped step's loss (and its terms) is left out of the logged ones."""
        row = self.losses[self.used - 1]
        bad = float(not torch.isfinite(row[0]))  # the loss decides, not the logged terms
        _, (bad,) = gather_sum_max([], [bad], self.device)
        if bad:
            row.zero_()
            self.skipped += 1
            self.skipped_since_read += 1
        return not bad

    def metrics(self) -> dict[str, int]:
        """The steps skipped so far (counted on the host as they are decided)."""
        return {"train/nonfinite_skipped_steps": self.skipped}
