"""The one line a failed checkpoint save or load ends the run with (torch.distributed.
checkpoint's exceptions carry each failed rank's own). Loaded only when one fails.
"""

from __future__ import annotations

from pathlib import Path

from gearshift.engine.failures import TrainingFailed


class CheckpointWriteFailed(TrainingFailed):
    """A checkpoint write failed; the message is one line."""


def describe_failure(error: BaseException) -> str:
    """One line for what failed in a DCP save or load (its CheckpointException carries
    each failed rank's own exception)."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, (cause, _) = sorted(failures.items(), key=lambda item: item[0])[0]
        lines = str(cause).strip().splitlines() or [""]
        return f"rank {rank}: {type(cause).__name__}: {lines[0]}"
    lines = str(error).strip().splitlines() or [""]
    return f"{type(error).__name__}: {lines[0]}"


def write_failed(
    path: Path, error: BaseException, async_save: bool, latest: Path | None
) -> CheckpointWriteFailed:
    """A failed write of `path` (the run's checkpoints stay as they were: the torn folder is
    temporary, removed by the next save); `latest`: the newest complete checkpoint."""
    how = "checkpoint.async_save: writing" if async_save else "writing checkpoint"
    return CheckpointWriteFailed(
        f"{how} {path} failed ({describe_failure(error)}); the newest complete "
        f"checkpoint is {latest}"
    )
