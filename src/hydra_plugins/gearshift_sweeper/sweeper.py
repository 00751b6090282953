"""`hydra/sweeper=gearshift_optuna`: the plugin and its config node, all that Hydra's plugin scan
loads of the sweeper in every run; the sweep itself (Optuna, the study, the report) is _sweep.py's.
(No `from __future__ import annotations`: see gearshift_launcher/__init__.py.)
"""

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper

from hydra_plugins.gearshift_launcher import LazyPlugin


class OptunaSweeper(LazyPlugin, Sweeper):
    implementation = "hydra_plugins.gearshift_sweeper._sweep.StudySweeper"

    def sweep(self, arguments: list[str]) -> Any:
        return self.impl.sweep(arguments)


@dataclass
class PrunerArgs:
    """The pruner's keyword arguments (Optuna's names; which pruner takes which: _study.py
    `build_pruner`); null ones are left to its defaults. Steps are optimizer steps: the loop
    reports at each validation (val_every_n_steps)."""

    n_startup_trials: int | None = None  # trials that complete before any is pruned
    n_warmup_steps: int | None = None  # steps of a trial before it may be pruned
    interval_steps: int | None = None
    n_min_trials: int | None = None
    min_resource: Any = None  # int or "auto"
    max_resource: Any = None  # int or "auto"
    reduction_factor: int | None = None
    min_early_stopping_rate: int | None = None
    bootstrap_count: int | None = None


@dataclass
class OptunaSweeperConf:
    _target_: str = "hydra_plugins.gearshift_sweeper.sweeper.OptunaSweeper"
    direction: str = "minimize"  # or maximize (the presets: the task's mode)
    study_name: str = "study"
    # null: <sweep dir>/study.journal; a path: that journal file; a database URL (sqlite:///...)
    storage: str | None = None
    n_trials: int = 20  # in all, counting the trials of earlier runs of the same study
    n_jobs: int = 1  # trials at once (each in its own process or job: launcher processes/slurm)
    # a rerun finds a trial's process of an earlier sweep still running: wait for its result,
    # or stop it (SIGTERM: it saves) and launch it again to resume
    live_trials: str = "wait"
    sampler: str = "tpe"  # tpe | random | grid | cmaes | gp
    seed: int | None = 0  # the sampler's
    pruner: str = "none"  # none | median | successive_halving | hyperband
    pruner_args: PrunerArgs = field(default_factory=PrunerArgs)
    # points to try first, before the sampler's (Optuna's enqueue_trial), in a new study:
    # [{optimizer.lr: 0.1, batch_size: 64}, ...]; keys left out are sampled
    enqueue: list[dict[str, Any]] = field(default_factory=list)
    # key: choice(...) | range(start, stop, step) | interval(low, high) | tag(log, interval(...))
    params: dict[str, str] | None = None


ConfigStore.instance().store(
    group="hydra/sweeper", name="gearshift_optuna", node=OptunaSweeperConf, provider="gearshift"
)
