"""Checkpoint folders that survive crashes: written into a temporary folder, renamed into
place once DCP's `.metadata` is there (docs/checkpoints.md). What they hold:
state/checkpointer.py; reading one back, older single files too: state/checkpoint_reads.py.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

# One process is a layout like any other here: DCP's note that it assumes one is no news.
warnings.filterwarnings(
    "ignore",
    "torch.distributed is (disabled, )?unavailable or uninitialized, assuming",
    UserWarning,
)

NAME = re.compile(r"^step_(\d+)(\.pt)?$")  # a folder (DCP) or an older single file
BEST = "best"  # the best validation so far (state/best.py); resume=auto never picks it
METADATA = ".metadata"  # DCP's index of every shard, written last
EXTRA = "extra"  # the key of the job's non-tensor parts in a checkpoint (rank 0 writes it)


class CheckpointError(ValueError):
    """A checkpoint that cannot be used for this run; the message is one line."""


def checkpoint_path(folder: Path, step: int) -> Path:
    return folder / f"step_{step:09d}"


def temporary(path: Path) -> Path:
    """Where the ranks write `path` before it is complete."""
    return path.with_name(f".{path.name}.tmp")


def step_checkpoints(folder: Path) -> list[tuple[int, bool, Path]]:
    """(step, is a folder, path) of each complete step checkpoint in `folder`: a folder
    with its metadata, or an older single file."""
    found = []
    for path in folder.glob("step_*"):
        complete = (path / METADATA).is_file() if path.is_dir() else path.is_file()
        if (match := NAME.match(path.name)) and complete:
            found.append((int(match[1]), path.is_dir(), path))
    return sorted(found)


def latest_checkpoint(folder: Path) -> Path | None:
    """The complete checkpoint with the highest step in `folder` (temporary folders ignored;
    at one step a folder wins over an older single file)."""
    found = step_checkpoints(folder)
    return found[-1][2] if found else None


def clean_temporaries(folder: Path) -> None:
    """Remove what crashed saves left (call before this save writes anything)."""
    for stale in folder.glob(".*.tmp"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


def publish(tmp: Path, path: Path) -> None:
    """Rename the complete folder `tmp` into place (over an older `path`: best/, or a step
    written again after a resume from an earlier one)."""
    old = path.with_name(f".{path.name}.old.tmp")
    if path.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
    # the rename itself on disk: a directory's entries are flushed through its own fd
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def link_checkpoint(source: Path, path: Path) -> None:
    """The complete checkpoint `source` (best/, written at this very position) as `path` too:
    hard links to the same files (copies where the file system has none), renamed into
    place. A later best/ replaces its own folder only, and rotation removes `path` only."""
    tmp = temporary(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for file in source.iterdir():
        try:
            os.link(file, tmp / file.name)
        except OSError:
            shutil.copyfile(file, tmp / file.name)
    publish(tmp, path)


def rotate(folder: Path, keep: int) -> None:
    """Keep the newest `keep` step checkpoints (best/ is none: rotation never touches it)."""
    for _, is_folder, path in step_checkpoints(folder)[:-keep]:
        shutil.rmtree(path) if is_folder else path.unlink(missing_ok=True)


def to_bytes(state: Any) -> bytes:
    """A non-tensor part as one opaque object in a DCP checkpoint (torch.save format)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()
