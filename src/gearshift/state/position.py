"""Where training stands, and the data position a resumed run continues from: the epoch's
samples the whole job took (data/loading_base.py `epoch_order`), not its batches, so a run
that comes back on another layout trains each remaining sample once (docs/checkpoints.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Position:
    """Optimizer steps done, and the next sample of the epoch to train on."""

    step: int = 0
    epoch: int = 0
    epoch_start: int = 0  # the epoch's sample this rank's batches started from (a resume)
    batch: int = 0  # batches this rank has taken since `epoch_start`
    samples: int = 0  # samples this rank trained on
    trained: int = 0  # samples the whole job trained on, nominal (global_batch a batch)
    global_batch: int = field(default=0, repr=False, compare=False)  # samples per batch, all ranks
    # this rank's batches in the epoch, from epoch_start
    epoch_batches: int = field(default=0, repr=False, compare=False)
    # (this rank's `samples`, the job's `trained`) when this start resumed
    resumed_at: tuple[int, int] = field(default=(0, 0), repr=False, compare=False)
    # Iterable data: the stream batches (data/streams.py), whose state is part of this one
    stream: Any = field(default=None, repr=False, compare=False)

    @property
    def epoch_samples(self) -> int:
        """The epoch's samples the whole job has taken: where a resumed run starts."""
        return self.epoch_start + self.batch * self.global_batch

    @property
    def samples_counted(self) -> tuple[int, int]:
        """(the job's samples before this start, this rank's since): summary.json adds the
        first to the sum over ranks of the second, so a resume on another world size
        still counts the job's samples."""
        rank_before, job_before = self.resumed_at
        return job_before, self.samples - rank_before

    @property
    def epoch_done(self) -> bool:
        return self.epoch_batches > 0 and self.batch >= self.epoch_batches

    def next_epoch(self) -> None:
        self.epoch, self.epoch_start, self.batch = self.epoch + 1, 0, 0

    def state_dict(self) -> dict[str, Any]:
        """The position a resumed run starts from: an epoch's end is the next one's start."""
        epoch, start = (self.epoch + 1, 0) if self.epoch_done else (self.epoch, self.epoch_samples)
        state = {
            "step": self.step,
            "epoch": epoch,
            "epoch_samples": start,
            "samples": self.samples,
            "trained": self.trained,
            "global_batch": self.global_batch,
        }
        if self.stream is not None:  # what the stream needs to continue: global, JSON-able
            state["stream"] = self.stream.stream_state(
                epoch, 0 if epoch != self.epoch else self.batch
            )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Back at the saved position, the epoch's remaining samples dealt to this run's
        global batch."""
        from gearshift.state.checkpoint_reads import load_position  # resuming

        load_position(self, state)

    @property
    def key(self) -> tuple[int, int, int]:
        """Identifies the position (a best/ written here is this position's checkpoint)."""
        return self.step, self.epoch, self.epoch_samples
