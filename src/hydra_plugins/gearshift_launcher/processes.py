"""`hydra/launcher=processes`: the plugin and its config node, nothing more.

Each job of a sweep runs in a fresh Python process, one at a time, or in a device slot of
its own when the Optuna sweeper keeps trials in flight (_processes.py). Hydra imports every
plugin module of every run to find its plugins, so that machinery lives in modules whose
names start with `_` (out of the scan) and loads only when a sweep sets this launcher up.
(No `from __future__ import annotations`: Hydra loads plugin modules outside sys.modules,
where dataclasses cannot resolve them.)
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


class SequentialProcessLauncher(Launcher):
    def __init__(self, **params: Any) -> None:
        self.params = params
        self.launcher: Any = None  # _processes.ProcessLauncher, once set up

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        from hydra_plugins.gearshift_launcher._processes import ProcessLauncher

        self.launcher = ProcessLauncher(**self.params)
        self.launcher.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> list[JobReturn]:
        return self.launcher.launch(job_overrides, initial_job_idx)

    def use_slots(self, n: int) -> None:
        """A device slot for each of up to `n` jobs at once (the Optuna sweeper's n_jobs)."""
        self.launcher.use_slots(n)


@dataclass
class ProcessesConf(config.LocalQueueConf):
    _target_: str = "hydra_plugins.gearshift_launcher.processes.SequentialProcessLauncher"
    setup: list[str] | None = None  # shell lines run before each job


ConfigStore.instance().store(
    group="hydra/launcher", name="processes", node=ProcessesConf, provider="gearshift"
)
