"""Checkpoints that survive crashes, and the state a resumed run needs to continue exactly.

A checkpoint is written to a temporary file, flushed to disk and renamed over its final
name, so a crash mid-save leaves the previous checkpoints untouched and never a torn
file under a real name. Everything in it loads with `torch.load(weights_only=True)`:
tensors, numbers, strings and containers of them.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

NAME = re.compile(r"^step_(\d+)\.pt$")
BEST = "best.pt"  # the best validation so far (state/best.py); resume=auto never picks it


class CheckpointError(ValueError):
    """A checkpoint that cannot be used for this run; the message is one line."""


@dataclass
class Position:
    """Where training stands: steps done and the next batch to train on."""

    step: int = 0
    epoch: int = 0
    batch: int = 0  # index of the next batch within `epoch`
    samples: int = 0


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


def rng_state() -> dict[str, Any]:
    numpy_state = np.random.get_state()
    state = {
        "python": [list(x) if isinstance(x, tuple) else x for x in random.getstate()],
        "numpy": [
            numpy_state[0],
            torch.from_numpy(numpy_state[1].astype(np.int64)),
            *numpy_state[2:],
        ],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def full_state(model: torch.nn.Module, optimizer, sharded: bool) -> tuple[dict, dict]:
    """Model and optimizer state as one process holds them. Sharded (FSDP), every rank must
    call this: it gathers the shards onto rank 0's CPU (the other ranks get empty dicts), and
    the optimizer's state is keyed by parameter name."""
    if not sharded:
        return model.state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    return get_state_dict(
        model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )


def load_model_state(
    model: torch.nn.Module, checkpoint: dict[str, Any], path: Path, sharded: bool = False
) -> None:
    """Load the weights, or say in one line why this checkpoint belongs to another model."""
    ours, theirs = model.state_dict(), checkpoint["model"]
    missing, unexpected = ours.keys() - theirs.keys(), theirs.keys() - ours.keys()
    reshaped = [k for k in ours.keys() & theirs.keys() if ours[k].shape != theirs[k].shape]
    if missing or unexpected or reshaped:
        target = checkpoint.get("config", {}).get("model", {}).get("_target_")
        example = sorted(missing or unexpected or reshaped)[0]
        raise CheckpointError(
            f"resume={str(path)!r}: the checkpoint holds another model ({target}): "
            f"{len(missing)} missing, {len(unexpected)} unexpected and {len(reshaped)} "
            f"reshaped tensors (e.g. {example!r})"
        )
    if sharded:  # each rank keeps its own shard of the full tensors
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, theirs, options=StateDictOptions(full_state_dict=True))
    else:
        model.load_state_dict(theirs)


def load_optimizer_state(
    model: torch.nn.Module, optimizer, state: dict[str, Any], path: Path, sharded: bool
) -> None:
    by_name = any(isinstance(key, str) for key in state["state"])  # written under FSDP
    if by_name != sharded:
        written = "with" if by_name else "without"
        raise CheckpointError(
            f"resume={str(path)!r}: the checkpoint was written {written} distributed=fsdp "
            f"(its optimizer state is keyed differently); resume it {written} fsdp"
        )
    if sharded:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(model, optimizer, state, options=options)
    else:
        optimizer.load_state_dict(state)


def training_state(
    config: dict,
    model_state: dict,
    optimizer_state: dict,
    scaler,
    schedule,
    position: Position,
) -> dict[str, Any]:
    return {
        "config": config,
        "position": asdict(position),
        "model": model_state,
        "optimizer": optimizer_state,
        "scaler": scaler.state_dict(),
        "schedule": schedule.state_dict() if schedule is not None else None,
        "rng": rng_state(),
    }


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


def restore_training_state(
    checkpoint: dict[str, Any],
    path: Path,
    model: torch.nn.Module,
    optimizer,
    scaler,
    schedule,
    sharded: bool = False,
) -> Position:
    """Load everything a run needs to go on; sharded (FSDP): every rank loads the full
    checkpoint and keeps its shard."""
    load_model_state(model, checkpoint, path, sharded)
    load_optimizer_state(model, optimizer, checkpoint["optimizer"], path, sharded)
    scaler.load_state_dict(checkpoint["scaler"])
    if schedule is not None and checkpoint["schedule"] is not None:
        schedule.load_state_dict(checkpoint["schedule"])
    restore_rng_state(checkpoint["rng"])
    position = Position(**checkpoint["position"])
    log.info("resumed from %s at step %d", path, position.step)
    return position
