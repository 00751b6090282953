"""Where a run reports its validations beyond its own logs: a study's trial.

A run that is one trial of a hyper-parameter search (the sweeper sets the `trial` node)
tells its trial the task's monitor at every validation, and the study's pruner may answer
"stop here"; a run that fails tells its trial why, the moment it fails. The reporter that
talks to the study is the class `trial.reporter` names, built on rank 0 with the `trial`
node's other keys, and with several ranks its answers given to every rank. Loaded only in
a run that is a trial (a run of its own holds build.py's NoReporter), so the training
loop's layers never import a search library.
"""

from __future__ import annotations

from typing import Any, Protocol

from omegaconf import DictConfig

from gearshift.config.rules import locate
from gearshift.parallel.distributed import Ranks
from gearshift.parallel.process_group import rank_zero_value


class Reporter(Protocol):
    def report(self, step: int, value: float | None) -> bool:
        """Report the monitor's `value` after optimizer step `step`; True: stop (pruned)."""
        ...

    def fail(self, reason: str) -> None:
        """The run failed (`reason`: its one line): the trial is marked failed now."""
        ...


class RankZeroReporter:
    """Rank 0 reports; every rank gets its answer, so all of them stop at the same step.
    `reporter`: the trial's on rank 0, None on the others (nothing to report to)."""

    def __init__(self, reporter: Any) -> None:
        self.reporter = reporter

    def report(self, step: int, value: float | None) -> bool:
        pruned = self.reporter is not None and self.reporter.report(step, value)
        return bool(rank_zero_value(pruned))

    def fail(self, reason: str) -> None:
        if self.reporter is not None:  # no collective: a rank may fail alone
            self.reporter.fail(reason)


def build_reporter(trial: DictConfig, ranks: Ranks) -> Reporter:
    """The reporter of `trial`: `trial.reporter`'s class on rank 0; several ranks: behind
    RankZeroReporter."""
    reporter_class = locate("trial.reporter", trial.reporter)
    own = None
    if ranks.is_zero:
        own = reporter_class(storage=trial.storage, study=trial.study, number=trial.number)
    return RankZeroReporter(own) if ranks.world_size > 1 else own
