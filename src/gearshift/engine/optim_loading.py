"""Saved optimizer state back into the run's optimizers (engine/optim.py
Optimizers.load_state_dict): keyed by parameter name (resharded to this run), or an older
single file's, keyed by position; then each lr schedule's counters.

Loaded only where a checkpoint is read: a resumed run, evaluate.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class OptimizerStateMismatch(ValueError):
    """Saved optimizer state that does not fit this run's optimizers; one line."""


def load_optimizers_state(
    model: nn.Module,
    optimizers: list[torch.optim.Optimizer],
    schedules: list[Any],
    fsdp: bool,
    state: dict[str, Any],
) -> None:
    """`state` (Optimizers.state_dict's, or torch's own of one optimizer) into `optimizers`
    over `model`'s parameters, and the saved schedules' counters into `schedules`."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )
    from torch.distributed.tensor import DTensor

    state = dict(state)
    saved_schedules = state.pop("schedules", None)
    if not keyed_by_name(state):
        _load_by_position(optimizers, fsdp, state)
    else:
        values = [v for s in state.get("state", {}).values() for v in s.values()]
        whole = fsdp and not any(isinstance(v, DTensor) for v in values)
        options = StateDictOptions(full_state_dict=whole)
        set_optimizer_state_dict(model, optimizers, state, options=options)
    if saved_schedules is not None:
        if len(saved_schedules) != len(schedules):
            raise OptimizerStateMismatch(
                f"its optimizer state holds {len(saved_schedules)} lr schedules, this run "
                f"steps {len(schedules)}"
            )
        for schedule, saved in zip(schedules, saved_schedules, strict=True):
            schedule.load_state_dict(saved)


def _load_by_position(
    optimizers: list[torch.optim.Optimizer], fsdp: bool, state: dict[str, Any]
) -> None:
    if fsdp and state.get("state"):
        raise OptimizerStateMismatch(
            "this single-file checkpoint was written without distributed=fsdp (its "
            "optimizer state is keyed by position); resume it without fsdp"
        )
    if len(optimizers) != 1:
        raise OptimizerStateMismatch(
            f"its optimizer state (keyed by position) is one optimizer's; this run steps "
            f"{len(optimizers)}"
        )
    optimizers[0].load_state_dict(state)


def keyed_by_name(state: dict[str, Any]) -> bool:
    """Whether an optimizer state dict names its parameters (torch.distributed.checkpoint's
    helpers) rather than numbering them (torch's own `Optimizer.state_dict`)."""
    groups = state.get("param_groups", [])
    return any(isinstance(p, str) for group in groups for p in group.get("params", []))
