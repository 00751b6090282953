"""Checkpoint files that survive crashes (what they hold: state/checkpointer.py).

A checkpoint is written to a temporary file, flushed to disk and renamed over its final
name, so a crash mid-save leaves the previous checkpoints untouched and never a torn
file under a real name. Everything in it loads with `torch.load(weights_only=True)`:
tensors, numbers, strings and containers of them.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

NAME = re.compile(r"^step_(\d+)\.pt$")
BEST = "best.pt"  # the best validation so far (state/best.py); resume=auto never picks it


class CheckpointError(ValueError):
    """A checkpoint that cannot be used for this run; the message is one line."""


def find_resume(resume: str | None, folder: Path) -> Path | None:
    """resume=null: start fresh; auto: the newest checkpoint in `folder`, if any; else a path."""
    if resume is None:
        return None
    if resume != "auto":
        return Path(resume)
    path = latest_checkpoint(folder) if folder.is_dir() else None
    if path is None:
        log.debug("resume=auto: no checkpoint in %s yet, starting fresh", folder)
    return path


def checkpoint_path(folder: Path, step: int) -> Path:
    return folder / f"step_{step:09d}.pt"


def latest_checkpoint(folder: Path) -> Path | None:
    """The complete checkpoint with the highest step in `folder` (temporary files ignored)."""
    found = [(int(m[1]), p) for p in folder.glob("step_*.pt") if (m := NAME.match(p.name))]
    return max(found)[1] if found else None


def write_atomically(state: dict[str, Any], path: Path) -> Path:
    """torch.save into a temporary file, flushed to disk, then renamed over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as file:
        torch.save(state, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)
    return path


def save_checkpoint(state: dict[str, Any], folder: Path, step: int, keep: int) -> Path:
    """Write atomically, then drop all but the newest `keep` step checkpoints (best.pt is no
    step checkpoint: rotation never touches it)."""
    return _rotate(write_atomically(state, checkpoint_path(folder, step)), keep)


def best_as_checkpoint(folder: Path, step: int, keep: int) -> Path:
    """best.pt, written at this very position, as step `step`'s checkpoint too: a hard link
    to the same file (a copy where the file system has none), then the rotation. A later
    best.pt replaces its own name only, and the rotation unlinks the step's name only."""
    path = checkpoint_path(folder, step)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(folder / BEST, tmp)
    except OSError:
        shutil.copyfile(folder / BEST, tmp)
        with open(tmp, "rb") as file:
            os.fsync(file.fileno())
    os.replace(tmp, path)
    return _rotate(path, keep)


def _rotate(path: Path, keep: int) -> Path:
    """After writing `path`, a step checkpoint: keep the newest `keep` of them."""
    folder = path.parent
    steps = sorted(int(m[1]) for p in folder.glob("step_*.pt") if (m := NAME.match(p.name)))
    for old in steps[:-keep]:
        checkpoint_path(folder, old).unlink(missing_ok=True)
    for stale in folder.glob(".step_*.pt.tmp"):  # left by a save that crashed (ours is renamed)
        stale.unlink(missing_ok=True)
    log.info("checkpoint: %s", path)
    return path


def save_best(state: dict[str, Any], folder: Path) -> Path:
    """Write the best state so far over `folder/best.pt`, atomically."""
    path = write_atomically(state, folder / BEST)
    log.info("best checkpoint: %s (step %d)", path, state["position"]["step"])
    return path


def load_checkpoint(path: Path) -> dict[str, Any]:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise CheckpointError(
            f"resume={str(path)!r}: not a readable checkpoint ({error})"
        ) from None


# Where a node keeps its copy of the data: it may differ between nodes and restarts, and
# changes nothing about the training.
NODE_LOCAL_SETTINGS = {"data.stage_to"}


def changed_settings(saved: dict, now: dict, prefix: str = "") -> list[str]:
    """`key=old (now new)` for each setting of `now` that differs from the checkpoint's."""
    changes = []
    for key in sorted(saved.keys() | now.keys()):
        old, new = saved.get(key), now.get(key)
        if f"{prefix}{key}" in NODE_LOCAL_SETTINGS:
            continue
        if isinstance(old, dict) and isinstance(new, dict):
            changes += changed_settings(old, new, f"{prefix}{key}.")
        elif old != new:
            changes.append(f"{prefix}{key}={old} (now {new})")
    return changes
