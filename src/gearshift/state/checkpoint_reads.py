"""Reading checkpoints back (state/checkpoint_folders.py writes them; state/checkpointer.py
says what they hold): the checkpoint a run starts from (`Saved`, read by state/checkpointer.py
`read_resume`), a folder's metadata with its shard files checked, the job's parts, a
whole checkpoint consolidated in this process, and the work of the parts' `load_state_dict`
(the model's weights checked against its shapes, the random generators, the position).

Loaded only where a checkpoint is read: a resumed run, evaluate, export, generate,
model.init_from.
"""

from __future__ import annotations

import io
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from gearshift.state.checkpoint_folders import EXTRA, METADATA, CheckpointError, latest_checkpoint

log = logging.getLogger(__name__)


@dataclass
class Saved:
    """A checkpoint read at the start of a run: its path and its job parts (an older
    single-file checkpoint: everything in it)."""

    path: Path
    state: dict[str, Any]

    @property
    def config(self) -> dict[str, Any]:
        return self.state.get("config", {})

    @property
    def sharded(self) -> bool:
        """A DCP folder, whose tensors are read by state/restore.py `restore`."""
        return self.path.is_dir()

    @property
    def decisions(self) -> dict[str, Any]:
        """The saved run's decisions, as its summary.json's `gears` names them (checkpoints
        written before the whole record was kept: amp=on's alone; older ones: none)."""
        kept = self.state.get("decisions", {})
        if isinstance(kept.get("amp"), dict):  # {"amp": {"dtype", "reason"}}
            return {"amp": kept["amp"]["dtype"], "amp_reason": kept["amp"]["reason"]}
        return kept


def read_named(resume: str, folder: Path) -> Saved | None:
    """The checkpoint `resume` names (auto: the newest in `folder`, if any; else a path),
    read once (state/checkpointer.py read_resume); or None."""
    if resume == "auto":
        path = latest_checkpoint(folder)
        if path is None:
            log.debug("resume=auto: no checkpoint in %s yet, starting fresh", folder)
            return None
    else:
        path = Path(resume)
    return Saved(path, read_state(path))


def read_state(path: Path) -> dict[str, Any]:
    """What a start reads of the checkpoint at `path`: a folder's job parts, or a file."""
    return read_extra(path) if path.is_dir() else load_checkpoint(path)


def from_bytes(data: bytes) -> Any:
    """A non-tensor part of a DCP checkpoint (state/checkpoint_folders.py `to_bytes`)."""
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def read_metadata(path: Path):
    """DCP's metadata of the checkpoint folder `path`, its shard files checked: one line
    for a folder that is no checkpoint or lacks a shard (a torn copy, a deleted file)."""
    from torch.distributed.checkpoint import FileSystemReader

    where = f"resume={str(path)!r}"
    if not (path / METADATA).is_file():
        raise CheckpointError(f"{where}: not a checkpoint folder (no {METADATA}: incomplete or never written)")  # fmt: skip
    try:
        metadata = FileSystemReader(str(path)).read_metadata()
    except Exception as error:
        raise CheckpointError(f"{where}: unreadable {METADATA} ({error})") from None
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        end = info.offset + info.length
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for name, size in sorted(needed.items()):
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{where}: shard file {name} is missing; the checkpoint is incomplete")  # fmt: skip
        if file.stat().st_size < size:
            raise CheckpointError(f"{where}: shard file {name} is cut short ({file.stat().st_size} of {size} bytes)")  # fmt: skip
    return metadata


def read_extra(path: Path) -> dict[str, Any]:
    """The job's non-tensor parts of a checkpoint folder (config, decisions, position, ...),
    read in this process alone."""
    import torch.distributed.checkpoint as dcp

    read_metadata(path)
    holder: dict[str, Any] = {EXTRA: b""}
    try:
        dcp.load(holder, checkpoint_id=str(path), no_dist=True)
        return from_bytes(holder[EXTRA])
    except Exception as error:
        raise CheckpointError(
            f"resume={str(path)!r}: not a readable checkpoint ({error})"
        ) from None


def load_checkpoint(path: Path, parts: tuple[str, ...] | None = None) -> dict[str, Any]:
    """A whole checkpoint in this process, consolidated: plain tensors under the parts'
    names (model, optimizer keyed by parameter name, ema) beside the non-tensor parts; an
    older single file as it was saved. `parts`: only these sharded parts are read (a
    folder; evaluate and export need no optimizer state)."""
    if not path.is_dir():
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:
            raise CheckpointError(f"resume={str(path)!r}: not a readable checkpoint ({error})") from None  # fmt: skip
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    metadata = read_metadata(path)
    tops = {key.split(".")[0] for key in metadata.state_dict_metadata}
    tensors = {t for t in tops if t != EXTRA and not t.startswith("rng_")}
    if parts is not None:
        tensors &= set(parts)
    try:
        state = _load_state_dict_from_keys(tensors, checkpoint_id=str(path)) if tensors else {}
    except Exception as error:
        raise CheckpointError(
            f"resume={str(path)!r}: not a readable checkpoint ({error})"
        ) from None
    return read_extra(path) | state


class ModelMismatch(CheckpointError):
    """The saved weights are another model's."""


def mismatch(ours: dict[str, torch.Size], theirs: dict[str, torch.Size]) -> str | None:
    """What differs between two sets of tensor shapes by name, naming the first ones; None
    when they fit."""
    missing = sorted(ours.keys() - theirs.keys())
    unexpected = sorted(theirs.keys() - ours.keys())
    reshaped = sorted(k for k in ours.keys() & theirs.keys() if tuple(ours[k]) != tuple(theirs[k]))  # fmt: skip
    if not (missing or unexpected or reshaped):
        return None
    first = lambda names: ", ".join(repr(n) for n in names[:2])  # noqa: E731
    parts = [
        f"{len(missing)} missing" + (f" ({first(missing)})" if missing else ""),
        f"{len(unexpected)} unexpected" + (f" ({first(unexpected)})" if unexpected else ""),
        f"{len(reshaped)} reshaped",
    ]
    if reshaped:
        name = reshaped[0]
        parts[2] += f" ({first(reshaped)}: {list(theirs[name])}, model {list(ours[name])})"
    return ", ".join(parts) + " tensors"


def shapes(state: dict[str, Any]) -> dict[str, torch.Size]:
    return {k: v.shape for k, v in state.items() if isinstance(v, torch.Tensor)}


def load_model_state(model: nn.Module, state: dict[str, Any], fsdp: bool) -> None:
    """state/checkpointer.py ModelState.load_state_dict: sharded state (a DCP load) or a
    whole one (an older checkpoint, evaluate) into `model`, its shapes checked first."""
    if (problem := mismatch(shapes(model.state_dict()), shapes(state))) is not None:
        raise ModelMismatch(problem)
    if not fsdp:
        model.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.tensor import DTensor

    whole = not any(isinstance(v, DTensor) for v in state.values())
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=whole))


def set_rng_state(state: dict[str, Any]) -> None:
    """state/checkpointer.py RngState.load_state_dict: the process's generators (Python,
    NumPy, torch, CUDA) as RngState.state_dict saved them."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def load_position(position, state: dict[str, Any]) -> None:
    """state/position.py Position.load_state_dict: `position` (a Position) at the saved
    one, its epoch's samples dealt to this run's global batch."""
    position.step, position.epoch, position.samples = state["step"], state["epoch"], state["samples"]  # fmt: skip
    # checkpoints written before the position counted samples counted batches
    saved_batch = state.get("global_batch", position.global_batch)
    position.epoch_start = state.get("epoch_samples", state.get("batch", 0) * saved_batch)
    position.batch = 0
    if position.stream is not None and state.get("stream") is not None:
        position.stream.load_stream_state(state["stream"])
    if saved_batch != position.global_batch:
        log.info(
            "resumed at sample %d of epoch %d with %d samples per batch over all ranks "
            "(the checkpoint's run took %d): the epoch's remaining samples are dealt to "
            "this job's ranks, each trained once",
            position.epoch_start, position.epoch, position.global_batch, saved_batch,
        )  # fmt: skip
