"""What a resumed run repeats of the decisions its start made, read from its checkpoint's
record (`amp=on`'s dtype, the batch size `batch_size=auto` found), and its parts given
their state back. Loaded by build.py when the run resumes (and with `batch_size=auto`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from gearshift.engine.precision import AmpChoice, amp_name

if TYPE_CHECKING:
    from gearshift.data.device_transforms import DeviceTransforms
    from gearshift.data.transforms_off import Untransformed
    from gearshift.state.checkpointer import Checkpointer, Saved
    from gearshift.state.position import Position

log = logging.getLogger(__name__)


def resolve_amp_on_resume(choice: str, saved: Saved | None) -> AmpChoice | None:
    """The saved run's choice when it, too, asked for `amp=on`: a probe at each restart may
    measure differently on a busy machine, and a run must not change dtype midway."""
    decided = saved.decisions if saved else {}
    if "amp" not in decided:  # a checkpoint written before its decisions were kept
        return None
    dtype = {"off": None, "bfloat16": torch.bfloat16, "float16": torch.float16}[decided["amp"]]
    was = saved.config.get("amp", {}).get("dtype")
    if choice == "auto" and was == "auto":
        log.info("amp=on: %s, as resolved when this run started", amp_name(dtype))
        return AmpChoice(dtype, decided["amp_reason"])
    if was == "auto":
        log.info(
            "amp: the checkpoint trained with %s (amp=on); this command's amp wins",
            amp_name(dtype),
        )
    return None


def resumed_batch_size(saved: Saved | None) -> int | str | None:
    """The batch size the checkpoint's run trained with: its record's (batch_size=auto's
    find), else its config's (checkpoints written before the record was kept)."""
    if saved is None:
        return None
    return saved.decisions.get("batch_size", saved.config.get("batch_size"))


def resume(
    checkpointer: Checkpointer, saved: Saved, position: Position,
    transforms: DeviceTransforms | Untransformed, batches_per_epoch: int,
) -> None:  # fmt: skip
    """Each registered part its state from `saved` (state/restore.py), the samples trained
    as the checkpoint counted them, and the device transforms' per-batch random draws moved
    on to where they were."""
    from gearshift.state.budget import Trained
    from gearshift.state.restore import restore

    restore(checkpointer, saved)
    position.trained = Trained.of(saved).samples  # older checkpoints: counted from their steps
    position.resumed_at = (position.samples, position.trained)
    batches = position.epoch * batches_per_epoch + position.epoch_samples // position.global_batch
    transforms.start_at(batches)
