"""The Checkpointer: the one place that defines what a checkpoint holds (docs/checkpoints.md):
every registered part under its own name (`Checkpointer.state`), with the run's config, its
decisions (summary.json's `gears`, which a resumed run repeats) and the job's layout, in one
DCP step folder (state/checkpoint_folders.py). Resuming: `read_resume`, then
state/restore.py; `checkpoint.async_save=true`: state/async_writes.py.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from gearshift.config.schema import CheckpointConfig
from gearshift.parallel.distributed import Ranks
from gearshift.state import checkpoint_folders
from gearshift.state.position import Position

if TYPE_CHECKING:
    from torch.distributed.checkpoint.stateful import Stateful

    from gearshift.state.async_writes import AsyncWrites
    from gearshift.state.checkpoint_failures import CheckpointWriteFailed
    from gearshift.state.checkpoint_reads import Saved

log = logging.getLogger(__name__)


def read_resume(resume: str | None, folder: Path) -> Saved | None:
    """The checkpoint `resume` names (null: none; auto: the newest in `folder`, if any; else
    a path), read once; or None."""
    if resume is None or (resume == "auto" and not folder.is_dir()):
        return None  # resume=auto in a new run folder: nothing to resume yet
    from gearshift.state.checkpoint_reads import read_named  # a checkpoint to find and read

    return read_named(resume, folder)


class ModelState:
    """A model's weights by parameter name; under FSDP each rank's shards (DTensors)."""

    sharded = True  # through DCP

    def __init__(self, model: nn.Module, fsdp: bool = False) -> None:
        self.model, self.fsdp = model, fsdp

    def state_dict(self) -> dict[str, Any]:
        if not self.fsdp:
            return self.model.state_dict()
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.model)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Sharded state (a DCP load) or a whole one (an older checkpoint, evaluate)."""
        from gearshift.state.checkpoint_reads import load_model_state

        load_model_state(self.model, state, self.fsdp)


class RngState:
    """The process's random generators (Python, NumPy, torch, CUDA)."""

    def state_dict(self) -> dict[str, Any]:
        kind, keys, *numpy_rest = np.random.get_state()
        state = {
            "python": [list(x) if isinstance(x, tuple) else x for x in random.getstate()],
            "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), *numpy_rest],
            "torch": torch.get_rng_state(),
        }
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from gearshift.state.checkpoint_reads import set_rng_state

        set_rng_state(state)


def is_sharded(part: Stateful | None) -> bool:
    """Whether `part` is saved through DCP, every rank its own shards."""
    return bool(getattr(part, "sharded", False))


RANK_PARTS = {"rng"}  # one state per rank


@dataclass
class Layout:
    """How the job that writes a checkpoint is laid out (logged when a resume changes it)."""

    world_size: int
    strategy: str
    global_batch: int


class Checkpointer:
    """Saves and restores the registered parts into `folder/step_*/` and `folder/best/`."""

    def __init__(
        self,
        folder: Path,
        ranks: Ranks,
        config: dict[str, Any],
        decisions: dict[str, Any],
        cfg: CheckpointConfig,
        layout: Layout,
    ) -> None:
        self.folder, self.ranks, self.config, self.layout = folder, ranks, config, layout
        self.decisions = decisions  # what a resumed run repeats rather than decides again
        self.every, self.at_end, self.keep = cfg.every_n_steps, cfg.at_end, cfg.keep
        self.parts: dict[str, Stateful | None] = {}
        self.best_at: tuple[int, int, int] | None = None  # where best/ was last written
        self.writes: AsyncWrites | None = None  # checkpoint.async_save: the background writes
        if cfg.async_save:
            from gearshift.state.async_writes import AsyncWrites

            self.writes = AsyncWrites(self._failed)

    def register(self, name: str, part: Stateful | None) -> None:
        """Save `part` under `name` (None: a part this run does not have)."""
        self.parts[name] = part

    def due(self, step: int, last: bool) -> bool:
        """Whether a checkpoint is due after optimizer step `step` (`last`: the run's end)."""
        return bool(self.every and step % self.every == 0) or (last and self.at_end)

    def state(self) -> dict[str, Any]:
        """What this rank writes: its shards of the sharded parts (model, optimizer, ema), its
        rank parts (rng) and (rank 0) the job parts (position, scaler, best) as one object."""
        state: dict[str, Any] = {}
        job: dict[str, Any] = {}
        for name, part in self.parts.items():
            if is_sharded(part):
                state[name] = part.state_dict()
            elif name in RANK_PARTS:
                state[f"{name}_{self.ranks.rank}"] = checkpoint_folders.to_bytes(part.state_dict())
            else:
                job[name] = None if part is None else part.state_dict()
        if self.ranks.is_zero:
            job |= {"config": self.config, "decisions": self.decisions, "layout": vars(self.layout)}  # fmt: skip
            state[checkpoint_folders.EXTRA] = checkpoint_folders.to_bytes(job)
        return state

    def save(self, position: Position, check: Callable[[], None]) -> Path | None:
        """A step checkpoint at `position` (rank 0's path; None elsewhere), then rotation.
        At the very position best/ was just written (and checked), its files are the
        checkpoint's."""
        self.wait()
        path = checkpoint_folders.checkpoint_path(self.folder, position.step)
        if self.best_at != position.key:
            check()
            self._write(path, rotated=True)
        elif self.ranks.is_zero:
            checkpoint_folders.link_checkpoint(self.folder / checkpoint_folders.BEST, path)
            self._rotated(path)
        return path if self.ranks.is_zero else None

    def save_best(self, position: Position, check: Callable[[], None]) -> None:
        """The state at the best validation so far, over best/."""
        self.wait()
        check()
        self._write(self.folder / checkpoint_folders.BEST, rotated=False)
        self.best_at = position.key  # on every rank: save() agrees

    def _write(self, path: Path, rotated: bool) -> None:
        """Every rank writes its part of `path` into its temporary folder; rank 0 renames it
        into place once DCP's metadata is written (async: once the background write ends)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import DefaultSavePlanner

        # A tensor every rank holds (DDP's replicas) is written by rank 0: its buffers
        # (BatchNorm's statistics) are the ones DDP broadcasts to the others at each step.
        planner = DefaultSavePlanner(dedup_save_to_lowest_rank=True)
        tmp = checkpoint_folders.temporary(path)
        if self.ranks.is_zero:  # no rank writes a file before DCP's first collective
            self.folder.mkdir(parents=True, exist_ok=True)
            checkpoint_folders.clean_temporaries(self.folder)
        state = self.state()
        if self.writes is not None:
            self.writes.write(state, tmp, path, planner, partial(self._finish, tmp, path, rotated))
            return
        try:
            dcp.save(state, checkpoint_id=str(tmp), planner=planner)
        except BaseException as error:  # DCP's CheckpointException is no Exception
            if isinstance(error, KeyboardInterrupt | SystemExit):
                raise
            raise self._failed(path, error) from None
        self._finish(tmp, path, rotated)

    def _finish(self, tmp: Path, path: Path, rotated: bool) -> None:
        if not self.ranks.is_zero:
            return
        checkpoint_folders.publish(tmp, path)
        if rotated:
            self._rotated(path)
        else:
            log.info("best checkpoint: %s", path)

    def _rotated(self, path: Path) -> None:
        checkpoint_folders.rotate(self.folder, self.keep)
        log.info("checkpoint: %s", path)

    def wait(self) -> None:
        """Wait for the background write in flight, if any; one line if it failed."""
        if self.writes is not None:
            self.writes.wait()

    def _failed(self, path: Path, error: BaseException) -> CheckpointWriteFailed:
        """The one line a failed write ends the run with."""
        from gearshift.state.checkpoint_failures import write_failed  # a failed write only

        return write_failed(path, error, self.writes is not None, self.latest())

    def close(self, quiet: bool = False) -> None:
        """The end of the run: the last background write waited for (`quiet`: the run
        already fails, so a failed write is logged instead of raised)."""
        if self.writes is not None:
            self.writes.close(quiet)

    def latest(self) -> Path | None:
        return checkpoint_folders.latest_checkpoint(self.folder) if self.folder.is_dir() else None

    @property
    def best_path(self) -> str:
        return f"{self.folder.name}/{checkpoint_folders.BEST}"
