"""`hydra/launcher=processes`: each job of a sweep in a fresh Python process, one at a time,
or in a device slot of its own when the Optuna sweeper keeps trials in flight (_processes.py).
"""

from collections.abc import Sequence
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra_plugins.hydra_submitit_launcher import config

from hydra_plugins.gearshift_launcher import LazyPlugin


class SequentialProcessLauncher(LazyPlugin, Launcher):
    implementation = "hydra_plugins.gearshift_launcher._processes.ProcessLauncher"

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> list[JobReturn]:
        return self.impl.launch(job_overrides, initial_job_idx)


@dataclass
class ProcessesConf(config.LocalQueueConf):
    _target_: str = "hydra_plugins.gearshift_launcher.processes.SequentialProcessLauncher"
    setup: list[str] | None = None  # shell lines run before each job


ConfigStore.instance().store(
    group="hydra/launcher", name="processes", node=ProcessesConf, provider="gearshift"
)
