"""Data: the built-in sources, the loaders that feed any source, and the data gears."""

from __future__ import annotations

from pathlib import Path

from gearshift.config import ConfigError


class DataError(ConfigError):
    """Data that cannot be read, met while training (a damaged file) rather than by a config
    check: train.py's loop catches it, saves a checkpoint at its last optimizer step, then
    ends with this one line (exit 2)."""

    remedy = "fix the data"

    def after(self, checkpoint: Path | None) -> DataError:
        """This error, its message now saying where training stopped and how to go on."""
        if checkpoint is not None:
            remedy = f"{self.remedy}, then run the same command again to resume"
            self.args = (f"{self}; saved {checkpoint}: {remedy}",)
        return self
