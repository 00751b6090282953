"""The Checkpointer: the one place that defines what a checkpoint holds.

A checkpoint is the `state_dict()` of every part registered with the Checkpointer, each
under its own name (model, optimizer, scaler, schedule, rng, best, ema, position), beside
the run's config and the decisions a resumed run must repeat (what `amp=on` resolved to).
Resuming is the reverse: the file is read once per start (`read`), the build takes the
decisions it needs from it, and `restore` hands each registered part its own state.

Under FSDP every rank takes part in a save (the model's and the optimizer's shards are
gathered onto rank 0's CPU) and every rank loads the full state and keeps its shard.
Files are written by rank 0, atomically (state/checkpoint.py).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from gearshift.config.schema import CheckpointConfig
from gearshift.parallel.distributed import Ranks
from gearshift.state.checkpoint import (
    BEST,
    CheckpointError,
    best_as_checkpoint,
    changed_settings,
    find_resume,
    latest_checkpoint,
    load_checkpoint,
    save_best,
    save_checkpoint,
)
from gearshift.state.position import Position

log = logging.getLogger(__name__)


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class Saved:
    """A checkpoint read at the start of a run: its path and its contents."""

    path: Path
    state: dict[str, Any]

    @property
    def config(self) -> dict[str, Any]:
        return self.state.get("config", {})

    def decision(self, name: str) -> Any:
        """A decision the saved run made (None for checkpoints written before it was kept)."""
        return self.state.get("decisions", {}).get(name)


def read_resume(resume: str | None, folder: Path) -> Saved | None:
    """The checkpoint `resume` names (auto: the newest in `folder`), read once; or None."""
    path = find_resume(resume, folder)
    return None if path is None else Saved(path, load_checkpoint(path))


class ModelMismatch(CheckpointError):
    """The saved weights are another model's."""


class ModelState:
    """A model's weights, as one process holds them (FSDP: gathered from every rank)."""

    def __init__(self, model: nn.Module, sharded: bool = False) -> None:
        self.model, self.sharded = model, sharded

    def state_dict(self) -> dict[str, Any]:
        if not self.sharded:
            return self.model.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.model, options=options)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ours = self.model.state_dict()
        missing, unexpected = ours.keys() - state.keys(), state.keys() - ours.keys()
        reshaped = [k for k in ours.keys() & state.keys() if ours[k].shape != state[k].shape]
        if missing or unexpected or reshaped:
            example = sorted(missing or unexpected or reshaped)[0]
            raise ModelMismatch(
                f"{len(missing)} missing, {len(unexpected)} unexpected and {len(reshaped)} "
                f"reshaped tensors (e.g. {example!r})"
            )
        if not self.sharded:
            self.model.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(self.model, state, options=StateDictOptions(full_state_dict=True))


class OptimizerState:
    """An optimizer's state; under FSDP gathered and keyed by parameter name."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, sharded: bool) -> None:
        self.model, self.optimizer, self.sharded = model, optimizer, sharded

    def state_dict(self) -> dict[str, Any]:
        if not self.sharded:
            return self.optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(self.model, self.optimizer, options=options)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # written under FSDP (optimizer=muon's two optimizers: their own keys, never FSDP)
        by_name = any(isinstance(key, str) for key in state.get("state", {}))
        if by_name != self.sharded:
            written = "with" if by_name else "without"
            raise CheckpointError(
                f"the checkpoint was written {written} distributed=fsdp "
                f"(its optimizer state is keyed differently); resume it {written} fsdp"
            )
        if not self.sharded:
            self.optimizer.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(self.model, self.optimizer, state, options=options)


class RngState:
    """The process's random generators (Python, NumPy, torch, CUDA)."""

    def state_dict(self) -> dict[str, Any]:
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

    def load_state_dict(self, state: dict[str, Any]) -> None:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
        kind, keys, *rest = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


# Parts a checkpoint may lack: written before the part existed, or by a run without it.
OPTIONAL = {"best", "ema", "schedule"}


class Checkpointer:
    """Saves and restores the registered parts; rank 0 writes `folder/step_*.pt`, best.pt."""

    def __init__(
        self,
        folder: Path,
        ranks: Ranks,
        config: dict[str, Any],
        decisions: dict[str, Any],
        cfg: CheckpointConfig,
        sharded: bool = False,
    ) -> None:
        """`cfg`: the checkpoint node (every_n_steps, at_end, keep)."""
        self.folder, self.ranks, self.config = folder, ranks, config
        self.decisions = decisions  # what a resumed run repeats rather than decides again
        self.every, self.at_end, self.keep = cfg.every_n_steps, cfg.at_end, cfg.keep
        self.sharded = sharded
        self.parts: dict[str, Stateful | None] = {}
        self.best_at: tuple[int, int, int] | None = None  # where best.pt was last written

    def register(self, name: str, part: Stateful | None) -> None:
        """Save `part` under `name` (None: saved as None, a part this run does not have)."""
        self.parts[name] = part

    # ------------------------------------------------------------------ saving

    def due(self, step: int, last: bool) -> bool:
        """Whether a checkpoint is due after optimizer step `step` (`last`: the run's end)."""
        return bool(self.every and step % self.every == 0) or (last and self.at_end)

    def state(self, check: Callable[[], None]) -> dict[str, Any] | None:
        """The checkpoint's contents on rank 0, None on the others. Every rank calls it:
        `check` raises for a state that must not be saved (NaN weights), and sharded parts
        gather (FSDP)."""
        check()
        if not (self.ranks.is_zero or self.sharded):
            return None
        state = {name: None if p is None else p.state_dict() for name, p in self.parts.items()}
        if not self.ranks.is_zero:
            return None
        return {"config": self.config, "decisions": self.decisions, **state}

    def save(self, position: Position, check: Callable[[], None]) -> Path | None:
        """A step checkpoint at `position` (rank 0's path; None elsewhere), then rotation.
        At the very position best.pt was just written (and checked), that file is the
        checkpoint."""
        if self.best_at == position.key:
            if not self.ranks.is_zero:
                return None
            return best_as_checkpoint(self.folder, position.step, self.keep)
        state = self.state(check)
        if state is None:
            return None
        return save_checkpoint(state, self.folder, position.step, self.keep)

    def save_best(self, position: Position, check: Callable[[], None]) -> None:
        """The state at the best validation so far, over best.pt."""
        if (state := self.state(check)) is not None:
            save_best(state, self.folder)
        self.best_at = position.key  # on every rank: save() agrees

    def latest(self) -> Path | None:
        return latest_checkpoint(self.folder) if self.folder.is_dir() else None

    @property
    def best_path(self) -> str:
        return f"{self.folder.name}/{BEST}"

    # ------------------------------------------------------------------ resuming

    def restore(self, saved: Saved) -> None:
        """Hand every registered part its state from `saved`."""
        load_parts(saved, self.parts)
        changed = changed_settings(saved.config, self.config)  # a requeue changes none
        if changed and self.ranks.is_zero:  # rank 0 speaks for the job
            log.warning("resumed a run trained with other settings: %s", ", ".join(changed))
        log.info("resumed from %s at step %d", saved.path, saved.state["position"]["step"])


def load_parts(saved: Saved, parts: dict[str, Stateful | None]) -> None:
    """Load each part's state from `saved`; a part that does not fit ends the run with one
    line naming the checkpoint."""
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
    except ModelMismatch as error:
        target = saved.config.get("model", {}).get("_target_")
        raise CheckpointError(
            f"resume={str(saved.path)!r}: the checkpoint holds another model ({target}): {error}"
        ) from None
    except CheckpointError as error:
        raise CheckpointError(f"resume={str(saved.path)!r}: {error}") from None
