"""A `fit` for launch_local's ranks (local_ranks.py) that fails as training does, for the
tests that start the launcher in their own process: the ranks, spawned, import this module
and torch, not train.py and what it builds."""

from __future__ import annotations

import os

from gearshift.engine.failures import TrainingFailed


def fails_in_training(cfg, run_dir, run_name):
    raise TrainingFailed(f"non-finite loss (NaN or inf) on rank {os.environ['RANK']}")
