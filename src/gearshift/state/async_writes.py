"""`checkpoint.async_save=true`: DCP's asynchronous save (what a checkpoint holds:
state/checkpointer.py). The loop waits while the state is copied to host memory; the write
goes on in a background thread; the next save, the end of the run and a stop wait for it
(`wait`), and a write that failed ends the run there with one line. The folder is renamed
into place only after its write completed. Loaded only when checkpoint.async_save=true.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from gearshift.engine.failures import TrainingFailed

log = logging.getLogger(__name__)


class AsyncWrites:
    """A Checkpointer's background writes, one in flight at a time."""

    def __init__(self, failed: Callable[[Path, BaseException], TrainingFailed]) -> None:
        """`failed(path, error)`: the exception a failed write of `path` ends the run with
        (state/checkpoint_failures.py's CheckpointWriteFailed)."""
        self.failed = failed
        self.pending: tuple[Path, Future] | None = None  # a write in flight and its folder
        self.group = None  # the writes' own process group: their collectives run beside the loop's
        if torch.distributed.is_initialized():
            self.group = torch.distributed.new_group(backend="gloo")
        self.finisher = ThreadPoolExecutor(1, "checkpoint")
        self.stager = None  # host buffers the state is copied into, kept for each save

    def write(
        self, state: dict[str, Any], tmp: Path, path: Path, planner, finish: Callable[[], None]
    ) -> None:
        """Copy `state` to host memory, then write it into `tmp` in the background; `finish`
        (renaming it into place as `path`) runs once the write completed."""
        if self.stager is None:  # reused: a save copies into memory that is already mapped
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            self.stager = DefaultStager(StagingOptions(False, False, False, False))
        upload = dcp.async_save(
            state, checkpoint_id=str(tmp), process_group=self.group, planner=planner,
            async_stager=self.stager,
        )  # fmt: skip

        def written() -> None:
            upload.result()
            finish()

        # the state is staged (copied to host memory): the loop goes on while it is written
        self.pending = (path, self.finisher.submit(written))

    def wait(self) -> None:
        """Wait for the write in flight, if any; one line if it failed."""
        if self.pending is None:
            return
        (path, write), self.pending = self.pending, None
        try:
            write.result()
        except BaseException as error:  # DCP's CheckpointException is no Exception
            if isinstance(error, KeyboardInterrupt | SystemExit):
                raise
            raise self.failed(path, error) from None

    def close(self, quiet: bool) -> None:
        """The end of the run: wait for the last write (`quiet`: the run already fails, so
        a failed write is logged instead of raised), then free the staging buffers."""
        try:
            self.wait()
        except TrainingFailed as error:  # what `failed` made of it
            if not quiet:
                raise
            log.error("%s", error)
        finally:
            if self.stager is not None:
                self.stager.close()
                self.stager = None
