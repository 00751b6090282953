"""Models: any importable class through `model._target_`, plus small ones of our own."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gearshift.models.small import MLP, SimpleCNN

if TYPE_CHECKING:
    from gearshift.models.gpt import GPT

__all__ = ["GPT", "MLP", "SimpleCNN"]


def __getattr__(name: str) -> object:
    """`gearshift.models.GPT` (model=gpt's `_target_`) loads its module when first asked
    for (PEP 562): a run of another model does not import it."""
    if name == "GPT":
        from gearshift.models.gpt import GPT

        return GPT
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
