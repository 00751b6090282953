"""`hydra/launcher=slurm` (conf/hydra/launcher/slurm.yaml): the plugin and its config node.

submitit's SLURM launcher, plus one job per trial (`submit`) and a job that outlived its
sweep found again (`rejoin`), in _slurm.py: Hydra imports every plugin module of every run
to find its plugins, so that machinery lives in a module whose name starts with `_` (out of
the scan) and loads only when a sweep sets this launcher up. (No `from __future__ import
annotations`: Hydra loads plugin modules outside sys.modules, where dataclasses cannot
resolve them.)
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from hydra_plugins.hydra_submitit_launcher import config
from omegaconf import DictConfig


class SlurmLauncher(Launcher):
    def __init__(self, **params: Any) -> None:
        self.params = params
        self.launcher: Any = None  # _slurm.SlurmJobLauncher, once set up

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        from hydra_plugins.gearshift_launcher._slurm import SlurmJobLauncher

        self.launcher = SlurmJobLauncher(**self.params)
        self.launcher.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> list[JobReturn]:
        return self.launcher.launch(job_overrides, initial_job_idx)

    def submit(self, overrides: Sequence[str], number: int) -> Any:
        """Job `number` as a SLURM job of its own; its submitit job, at once."""
        return self.launcher.submit(overrides, number)

    def rejoin(self, job_id: str) -> Any:
        """The submitit job of SLURM job `job_id` while it lives or has its result; else None."""
        return self.launcher.rejoin(job_id)


@dataclass
class SlurmConf(config.SlurmQueueConf):
    _target_: str = "hydra_plugins.gearshift_launcher.slurm.SlurmLauncher"
    poll_s: int = 60  # at most this long between the sweep's questions to SLURM (sacct)


ConfigStore.instance().store(
    group="hydra/launcher", name="gearshift_slurm", node=SlurmConf, provider="gearshift"
)
