"""`profile.memory_snapshot=true` (CUDA): the caching allocator's history, for PyTorch's
memory viewer (https://pytorch.org/memory_viz), and the one line an out-of-memory error
ends a run with.

Recording starts as `build.py build_run` begins, so the model, optimizer state and every step
are in it; `profile/memory_snapshot.pickle` is written at the end of the run and whenever
training runs out of memory (rank N > 0 of a distributed run: `memory_snapshot_rankN.pickle`).
Recording costs about 2 us per allocation (PyTorch's figure) and up to MAX_ENTRIES entries of
a few KB each in host memory.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import torch

log = logging.getLogger(__name__)

MAX_ENTRIES = 100_000  # the newest allocations and frees kept: a few steps of a large model
VIEWER = "https://pytorch.org/memory_viz"


class MemoryHistory:
    def __init__(self, enabled: bool, device: torch.device, folder: Path, rank: int) -> None:
        self.recording = enabled and device.type == "cuda"
        name = "memory_snapshot.pickle" if rank == 0 else f"memory_snapshot_rank{rank}.pickle"
        self.path = folder / name
        if self.recording:
            torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES)

    def dump(self) -> Path | None:
        """Write the snapshot (atomically); None when not recording."""
        if not self.recording:
            return None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        torch.cuda.memory._dump_snapshot(str(tmp))
        os.replace(tmp, self.path)
        log.info("memory snapshot: %s (open it at %s)", self.path, VIEWER)
        return self.path

    def stop(self) -> None:
        if self.recording:
            torch.cuda.memory._record_memory_history(enabled=None)
            self.recording = False


def out_of_memory_message(
    error: BaseException,
    step: int,
    batch_size: int,
    history: MemoryHistory | None,
    amp: bool,
    checkpointing: bool,
    batch_size_auto: bool,
) -> str:
    """One line: where it ran out, the snapshot (if any: profile.memory_snapshot's `history`,
    dumped now and stopped) and the gears that would cut memory."""
    snapshot = None
    if history is not None:
        snapshot = history.dump()
        history.stop()
    asked = re.search(r"Tried to allocate [\d.]+ \w+", str(error))
    what = f" ({asked[0][0].lower()}{asked[0][1:]})" if asked else ""
    if snapshot is not None:
        seen = f"memory snapshot: {snapshot} (open it at {VIEWER})"
    else:
        seen = "no memory snapshot (profile.memory_snapshot=true records one on CUDA)"
    cuts = [] if amp else ["amp=on"]
    if not checkpointing:
        cuts.append("model.checkpointing=true")
    if batch_size > 1:
        cuts.append(f"batch_size={batch_size // 2}")
    if not batch_size_auto:
        cuts.append("batch_size=auto")
    cut = f"; to cut memory: {', '.join(cuts)}" if cuts else ""
    return (
        f"out of memory at step {step} with batch_size={batch_size} per device{what}; {seen}{cut}"
    )
