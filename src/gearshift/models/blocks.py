"""A model's blocks: the units activation checkpointing recomputes and FSDP shards one by one,
found in its nn.Sequential containers (docs/gears.md, tip 18, "FSDP per block").
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

# Here, not in recompute.py, so that the FLOP counter and the advisor can switch it off
# without loading activation checkpointing in a run that does not use it.
_recompute = {"enabled": True}  # switched off to count FLOPs or trace the model


def recomputing() -> bool:
    """Whether checkpointed containers recompute (recompute.py), outside recompute_disabled."""
    return _recompute["enabled"]


@contextmanager
def recompute_disabled() -> Iterator[None]:
    """Run checkpointed containers as plain ones (no recomputation) inside this block."""
    before = _recompute["enabled"]
    _recompute["enabled"] = False
    try:
        yield
    finally:
        _recompute["enabled"] = before


def holds_blocks(sequential: nn.Sequential) -> bool:
    """Whether some child of `sequential` is itself made of modules (a block, not a layer)."""
    return any(any(True for _ in child.children()) for child in sequential)


def model_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks of `model`, in the order they run; [] when it has none."""
    if isinstance(model, nn.Sequential) and holds_blocks(model):
        return list(model)
    return [block for child in model.children() for block in model_blocks(child)]
