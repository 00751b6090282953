"""`DataError`: data that cannot be read, met while training rather than by a config check.

It is a ConfigError (one line for the user, exit 2) that the training loop catches to save
a checkpoint first. It lives in config/, the bottom layer, so that data/ can raise it and
train.py's loop catch it, both importing it from `gearshift.config`.
"""

from __future__ import annotations

from pathlib import Path

from gearshift.config.rules import ConfigError


class DataError(ConfigError):
    """Data that cannot be read, met while training (a damaged file): the run saves a
    checkpoint at its last optimizer step, then ends with this one line (exit 2)."""

    remedy = "fix the data"

    def after(self, checkpoint: Path | None) -> DataError:
        """This error, its message now saying where training stopped and how to go on."""
        if checkpoint is not None:
            remedy = f"{self.remedy}, then run the same command again to resume"
            self.args = (f"{self}; saved {checkpoint}: {remedy}",)
        return self
