"""`hydra/launcher=processes`: each job of a sweep in a fresh Python process, one at a time.

Hydra's basic launcher runs every job inside the sweep's own process, so what one run
leaves behind (the process's peak resident memory, allocator caches, compiled kernels)
shows up in the figures of the runs after it. submitit's local launcher starts a fresh
process per job, but all of them at once, so they compete for the machine. A sweep
that measures (the gear ablation) wants both: every run alone, in its own process.
Job logs go to `<sweep folder>/.submitit/`. (No `from __future__ import annotations`:
Hydra loads plugin modules outside sys.modules, where dataclasses cannot resolve them.)
"""

import logging
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus
from hydra_plugins.hydra_submitit_launcher import config, submitit_launcher

log = logging.getLogger(__name__)


def keep_visible_gpus() -> list[str]:
    """Shell lines that give the job the GPUs this process sees (submitit's local executor
    sets CUDA_VISIBLE_DEVICES from gpus_per_node, which would hide or renumber them)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return ["unset CUDA_VISIBLE_DEVICES"]
    return [f"export CUDA_VISIBLE_DEVICES={shlex.quote(listed)}"]


class SequentialProcessLauncher(submitit_launcher.LocalLauncher):
    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.params["setup"] = keep_visible_gpus() + list(self.params.get("setup") or [])

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> list[JobReturn]:
        results = []
        for offset, overrides in enumerate(job_overrides):
            [result] = super().launch([overrides], initial_job_idx + offset)
            failed = result.status == JobStatus.FAILED
            log.info("\t#%d %s", initial_job_idx + offset, "failed" if failed else "done")
            results.append(result)
        return results


@dataclass
class ProcessesConf(config.LocalQueueConf):
    _target_: str = "hydra_plugins.gearshift_launcher.processes.SequentialProcessLauncher"
    setup: list[str] | None = None  # shell lines run before each job


ConfigStore.instance().store(
    group="hydra/launcher", name="processes", node=ProcessesConf, provider="gearshift"
)
