"""The machinery of `hydra/launcher=slurm` (slurm.py, the plugin, hands its jobs to
`SlurmJobLauncher`): hydra-submitit-launcher's SLURM launcher (conf/hydra/launcher/
slurm.yaml), plus what a sweeper that keeps trials in flight needs from it.

A plain multirun (`launch`) is the parent's: the sweep's points as one job array, waited for
together. The Optuna sweeper (gearshift_sweeper) instead submits each trial as a job of its
own (`submit`), records the job's id in the study before it waits, and, when a sweep that
died is run again, finds the job by that id and asks SLURM whether it still lives
(`rejoin`): a pending or running job is waited for, not launched a second time.
"""

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import filter_overrides
from hydra_plugins.hydra_submitit_launcher import config, submitit_launcher
from omegaconf import OmegaConf

log = logging.getLogger(__name__)

# SLURM's states of a job that has not ended: it runs, waits to run (again: requeued or
# preempted jobs come back) or is being set up or torn down. Anything else, and a job SLURM
# no longer knows (UNKNOWN), has ended.
ALIVE = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "RESIZING",
    "PREEMPTED",
    "SIGNALING",
    "STAGE_OUT",
}


class SlurmJobLauncher(submitit_launcher.SlurmLauncher):
    def setup(self, *args: Any, **kwargs: Any) -> None:
        super().setup(*args, **kwargs)
        from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

        # submitit asks SLURM (sacct) about its jobs 2, 4, 8, ... s after the last submission,
        # then every 10 minutes: a job that died without a result went unnoticed that long.
        # The key is this process's, not the jobs': submitit's executor would not know it.
        SlurmJob.watcher = SlurmInfoWatcher(delay_s=self.params.pop("poll_s"))

    def executor(self) -> Any:
        """The submitit executor with this launcher's parameters (as the parent's `launch`
        builds it for every call)."""
        import submitit

        executor = submitit.AutoExecutor(
            cluster=self._EXECUTOR,
            folder=self.params["submitit_folder"],
            slurm_max_num_timeout=self.params["max_num_timeout"],
        )
        common = set(OmegaConf.structured(config.BaseQueueConf).keys())
        init_keys = {"submitit_folder", "max_num_timeout"}
        executor.update_parameters(
            **{
                key if key in common else f"{self._EXECUTOR}_{key}": value
                for key, value in self.params.items()
                if key not in init_keys
            }
        )
        return executor

    def submit(self, overrides: Sequence[str], number: int) -> Any:
        """Job `number` (its overrides) as a SLURM job of its own; returns the submitit job
        at once (its `job_id` is SLURM's), without waiting for it."""
        assert self.config is not None
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in self.config.hydra.sweep:
            os.chmod(sweep_dir, mode=int(str(self.config.hydra.sweep.mode), 8))
        job = self.executor().submit(
            self,
            list(overrides),
            "hydra.sweep.dir",
            number,
            f"job_id_for_{number}",
            Singleton.get_state(),
        )
        log.info(
            "\t#%d : %s (SLURM job %s)", number, " ".join(filter_overrides(overrides)), job.job_id
        )
        return job

    def rejoin(self, job_id: str) -> Any:
        """The submitit job of an earlier submission (SLURM id `job_id`) when SLURM still runs
        it or will (pending, requeued), or it ended with its result (returned or raised)
        while nobody waited: `results()` waits for it as for a job just submitted. None when
        the job is gone without a result (killed, cancelled, lost with its node, forgotten)."""
        import submitit

        job = submitit.SlurmJob(folder=self.params["submitit_folder"], job_id=job_id)
        if job.paths.result_pickle.exists():
            return job
        state = job.watcher.get_state(job_id, mode="force")  # asks SLURM now (sacct)
        if state.split()[0].upper() in ALIVE:  # sacct may say "CANCELLED by 0"
            return job
        log.info("SLURM job %s is gone (%s) without a result", job_id, state)
        return None
