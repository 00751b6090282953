"""How run_task ends a run that does not train to its end, beside its one line: a stopped
run's line names the command that resumes it, and a run refused before its first step
leaves no run folder behind. Loaded only then.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from hydra.types import RunMode
from omegaconf import DictConfig

from gearshift.state import run_lock
from gearshift.state.preemption import TrainingStopped


def stop_line(stopped: TrainingStopped, hydra_cfg: DictConfig) -> str:
    """The one line a stopped run ends with: the signal, the step, the checkpoint, and the
    command that resumes it (resume=auto in the same run folder)."""
    if hydra_cfg.mode == RunMode.MULTIRUN:
        again = f"run the same sweep with hydra.sweep.dir={hydra_cfg.sweep.dir}"
    else:
        again = f"run the same command with hydra.run.dir={hydra_cfg.run.dir}"
    if stopped.checkpoint is None:
        return f"{stopped}; no checkpoint saved"
    return f"{stopped}; checkpoint {stopped.checkpoint}; to resume, {again}"


def remove_empty_run_dir(run_dir: Path) -> None:
    """Drop a run folder that holds nothing but what Hydra wrote before the task began,
    and the folders above it (runs/, multirun/<date>/) that it leaves empty."""
    leftovers = {p.name for p in run_dir.iterdir()} - {".hydra", "train.log", run_lock.LOCK_FILE}
    if leftovers:
        return
    logging.shutdown()  # close train.log before removing it
    shutil.rmtree(run_dir, ignore_errors=True)
    cwd = Path.cwd().resolve()
    for parent in run_dir.resolve().parents:
        if cwd not in parent.parents:
            break
        try:
            parent.rmdir()  # only when empty
        except OSError:
            break
