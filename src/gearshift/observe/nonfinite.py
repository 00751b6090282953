"""The line a run ends with when its loss or its weights are no longer finite
(`on_nonfinite=stop`, loss_watch.py finds them): what, where, the checkpoint to go back
to and what to try. Loaded only then.
"""

from __future__ import annotations

from pathlib import Path


def nonfinite_message(
    bad_step: int | None, step: int, last_checkpoint: Path | None, on_nonfinite: str
) -> str:
    """The line a NaN/inf loss (at `bad_step`) or NaN/inf weights (None: the loss was
    finite; found after `step`) end the run with."""
    what = (
        f"non-finite loss (NaN or inf) at step {bad_step}"
        if bad_step is not None
        else f"non-finite weights at step {step} (the loss was finite)"
    )
    kept = (
        f"the last good checkpoint: {last_checkpoint}"
        if last_checkpoint
        else "no checkpoint was saved before it"
    )
    return (
        f"{what}; stopped (on_nonfinite={on_nonfinite}), {kept}; "
        "try a lower optimizer.lr, or on_nonfinite=skip to skip such steps' updates"
    )
