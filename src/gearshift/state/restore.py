"""Resuming (state/checkpointer.py describes what a checkpoint holds): `restore` hands every
part registered with the Checkpointer its state from the checkpoint the run resumes from,
resharded to this run's layout; `load_parts` loads whole states (an older single file,
evaluate). Loaded only by a run that resumes, and by evaluate.

The RNG streams come back exactly when the world size is the same; on another world size
each rank is reseeded from (seed, rank, step), since a rank's stream has no counterpart there.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from gearshift.engine.optim_loading import OptimizerStateMismatch
from gearshift.engine.runtime import seed_everything
from gearshift.state.checkpoint_failures import describe_failure
from gearshift.state.checkpoint_folders import CheckpointError
from gearshift.state.checkpoint_reads import (
    ModelMismatch,
    Saved,
    from_bytes,
    mismatch,
    read_metadata,
    shapes,
)
from gearshift.state.checkpointer import RANK_PARTS, Checkpointer, is_sharded

if TYPE_CHECKING:
    from torch.distributed.checkpoint.stateful import Stateful

log = logging.getLogger(__name__)

# Parts a checkpoint may lack: written before the part existed, or by a run without it.
OPTIONAL = {"best", "ema"}


def restore(checkpointer: Checkpointer, saved: Saved) -> None:
    """Hand every registered part its state from `saved`, resharded to this run."""
    if saved.sharded:
        _restore_sharded(checkpointer, saved)
    else:  # an older single file: whole tensors
        load_parts(saved, checkpointer.parts)
    changed = changed_settings(saved.config, checkpointer.config)  # a requeue changes none
    if checkpointer.ranks.is_zero:
        if changed:  # rank 0 speaks for the job
            log.warning("resumed a run trained with other settings: %s", ", ".join(changed))
        _log_layout(checkpointer, saved)
    log.info("resumed from %s at step %d", saved.path, saved.state["position"]["step"])


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


def _restore_sharded(checkpointer: Checkpointer, saved: Saved) -> None:
    import torch.distributed.checkpoint as dcp

    where = f"resume={str(saved.path)!r}"
    stored = read_metadata(saved.path).state_dict_metadata
    template: dict[str, Any] = {}
    for name, part in checkpointer.parts.items():
        if not is_sharded(part):
            continue
        theirs = {k[len(name) + 1 :]: getattr(m, "size", None) for k, m in stored.items() if k.startswith(f"{name}.")}  # fmt: skip
        if not theirs and name in OPTIONAL:
            continue
        state = part.state_dict()
        if name in ("model", "ema"):
            ours = shapes(state)
            theirs = {k: v for k, v in theirs.items() if v is not None}
            if (problem := mismatch(ours, theirs)) is not None:
                target = saved.config.get("model", {}).get("_target_")
                raise CheckpointError(f"{where}: the checkpoint holds another model ({target}): {problem}")  # fmt: skip
        template[name] = state
    template |= _rank_template(checkpointer, saved, stored)
    try:
        dcp.load(template, checkpoint_id=str(saved.path))
    except BaseException as error:  # DCP's CheckpointException is no Exception
        if isinstance(error, KeyboardInterrupt | SystemExit):
            raise
        raise CheckpointError(f"{where}: its state does not fit this run ({describe_failure(error)})") from None  # fmt: skip
    for name, part in checkpointer.parts.items():
        if part is None:
            continue
        if name in template:
            try:
                part.load_state_dict(template[name])
            except OptimizerStateMismatch as error:
                raise CheckpointError(f"{where}: {error}") from None
        elif f"{name}_{checkpointer.ranks.rank}" in template:
            part.load_state_dict(from_bytes(template[f"{name}_{checkpointer.ranks.rank}"]))
        elif name in RANK_PARTS:
            step = saved.state["position"]["step"]
            reseed(int(checkpointer.config.get("seed", 0)), checkpointer.ranks.rank, step)
        elif saved.state.get(name) is not None:
            part.load_state_dict(saved.state[name])
        elif name == "ema":  # a run that turns the average on: it starts from the weights
            log.warning("%s holds no weight average: it starts from the resumed weights", saved.path)  # fmt: skip
            part.load_state_dict(template["model"])
        elif name not in OPTIONAL:
            raise CheckpointError(f"{where}: it holds no {name} state")


def _rank_template(
    checkpointer: Checkpointer, saved: Saved, stored: dict[str, Any]
) -> dict[str, Any]:
    """This rank's own RNG stream where the world size is the saved one; none else."""
    layout = saved.state.get("layout", {})
    if layout.get("world_size") != checkpointer.layout.world_size:
        return {}
    names = [
        f"{name}_{checkpointer.ranks.rank}" for name in RANK_PARTS if name in checkpointer.parts
    ]
    return {key: b"" for key in names if key in stored}


def _log_layout(checkpointer: Checkpointer, saved: Saved) -> None:
    was, now = saved.state.get("layout", {}), vars(checkpointer.layout)
    changes = [f"{key.replace('_', ' ')} {was.get(key)} -> {now[key]}" for key in now if was.get(key) != now[key]]  # fmt: skip
    if not changes:
        return
    log.info("resumed on another layout: %s; model and optimizer resharded", ", ".join(changes))
    if was.get("world_size") != now["world_size"] and "rng" in checkpointer.parts:
        log.info(
            "resume: the data order is exact (the epoch's remaining samples are dealt to "
            "%d ranks); the random streams are reseeded from (seed, rank, step), as the "
            "saved per-rank streams belong to %s ranks",
            now["world_size"], was.get("world_size"),
        )  # fmt: skip


def reseed(seed: int, rank: int, step: int) -> None:
    """Fresh random streams for `rank` resuming at `step` on another world size."""
    seed_everything(int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0]))


def load_parts(saved: Saved, parts: dict[str, Stateful | None]) -> None:
    """Load each part's state from a whole checkpoint (an older single file, or a folder
    consolidated by load_checkpoint); a part that does not fit ends the run with one line
    naming the checkpoint."""
    try:
        for name, part in parts.items():
            if part is None:
                continue
            if saved.state.get(name) is not None:
                part.load_state_dict(saved.state[name])
            elif name == "ema":  # a run that turns the average on: it starts from the weights
                log.warning("%s holds no weight average: it starts from the resumed weights", saved.path)  # fmt: skip
                part.load_state_dict(saved.state["model"])
            elif name not in OPTIONAL:
                raise CheckpointError(f"it holds no {name} state")
    except OptimizerStateMismatch as error:
        raise CheckpointError(f"resume={str(saved.path)!r}: {error}") from None
    except ModelMismatch as error:
        target = saved.config.get("model", {}).get("_target_")
        raise CheckpointError(
            f"resume={str(saved.path)!r}: the checkpoint holds another model ({target}): {error}"
        ) from None
    except CheckpointError as error:
        raise CheckpointError(f"resume={str(saved.path)!r}: {error}") from None
