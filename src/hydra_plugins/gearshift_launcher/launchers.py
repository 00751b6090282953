"""The launchers' plugins and config nodes, all that Hydra's plugin scan loads of them in every
run (docs/layout.md, "Pay for what you use"): `hydra/launcher=processes`, its machinery in
_processes.py, and `hydra/launcher=slurm` (conf/hydra/launcher/slurm.yaml), in _slurm.py.
(No `from __future__ import annotations`: Hydra loads plugin modules outside sys.modules,
where dataclasses cannot resolve them.)
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.utils import get_class
from hydra_plugins.hydra_submitit_launcher import config


class LazyPlugin:
    """A plugin whose work its `implementation` does, imported and built with the plugin's
    params when Hydra sets the plugin up. The Optuna sweeper's plugin is one too; its sweep
    calls what a launcher's implementation adds (use_slots, submit, rejoin) on `impl`."""

    implementation: str  # module.Class

    def __init__(self, **params: Any) -> None:
        self.params = params
        self.impl: Any = None  # an `implementation`, once set up

    def setup(self, **context: Any) -> None:  # Hydra's hydra_context, task_function, config
        self.impl = get_class(self.implementation)(**self.params)
        self.impl.setup(**context)


class SequentialProcessLauncher(LazyPlugin, Launcher):
    implementation = "hydra_plugins.gearshift_launcher._processes.ProcessLauncher"

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> list[JobReturn]:
        return self.impl.launch(job_overrides, initial_job_idx)


@dataclass
class ProcessesConf(config.LocalQueueConf):
    _target_: str = "hydra_plugins.gearshift_launcher.launchers.SequentialProcessLauncher"
    setup: list[str] | None = None  # shell lines run before each job


class SlurmLauncher(LazyPlugin, Launcher):
    implementation = "hydra_plugins.gearshift_launcher._slurm.SlurmJobLauncher"

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> list[JobReturn]:
        return self.impl.launch(job_overrides, initial_job_idx)


@dataclass
class SlurmConf(config.SlurmQueueConf):
    _target_: str = "hydra_plugins.gearshift_launcher.launchers.SlurmLauncher"
    poll_s: int = 60  # at most this long between the sweep's questions to SLURM (sacct)


store = ConfigStore.instance().store
store(group="hydra/launcher", name="processes", node=ProcessesConf, provider="gearshift")
store(group="hydra/launcher", name="gearshift_slurm", node=SlurmConf, provider="gearshift")
