"""`hydra/launcher=slurm` (conf/hydra/launcher/slurm.yaml): submitit's SLURM launcher, plus
one job per trial (`submit`) and a job that outlived its sweep found again (`rejoin`), in
_slurm.py.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra_plugins.hydra_submitit_launcher import config

from hydra_plugins.gearshift_launcher import LazyPlugin


class SlurmLauncher(LazyPlugin, Launcher):
    implementation = "hydra_plugins.gearshift_launcher._slurm.SlurmJobLauncher"

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> list[JobReturn]:
        return self.impl.launch(job_overrides, initial_job_idx)


@dataclass
class SlurmConf(config.SlurmQueueConf):
    _target_: str = "hydra_plugins.gearshift_launcher.slurm.SlurmLauncher"
    poll_s: int = 60  # at most this long between the sweep's questions to SLURM (sacct)


ConfigStore.instance().store(
    group="hydra/launcher", name="gearshift_slurm", node=SlurmConf, provider="gearshift"
)
