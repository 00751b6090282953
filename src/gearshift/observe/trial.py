"""Where a run reports its validations beyond its own logs: a study's trial.

A run that is one trial of a hyper-parameter search (the sweeper sets the `trial` node)
tells its trial the task's monitor at every validation, and the study's pruner may answer
"stop here"; a run that fails tells its trial why, the moment it fails. The reporter that
talks to the study is named by `trial.reporter` and imported only then, so the training
loop's layers never import a search library.
"""

from __future__ import annotations

from typing import Protocol

from omegaconf import DictConfig

from gearshift.config.rules import locate
from gearshift.parallel.distributed import Ranks, rank_zero_value


class Reporter(Protocol):
    def report(self, step: int, value: float | None) -> bool:
        """Report the monitor's `value` after optimizer step `step`; True: stop (pruned)."""
        ...

    def fail(self, reason: str) -> None:
        """The run failed (`reason`: its one line): the trial is marked failed now."""
        ...


class NoReporter:
    """A run of its own: nothing to report to, never pruned."""

    def report(self, step: int, value: float | None) -> bool:
        return False

    def fail(self, reason: str) -> None:
        pass


class RankZeroReporter:
    """Rank 0 reports; every rank gets its answer, so all of them stop at the same step."""

    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter

    def report(self, step: int, value: float | None) -> bool:
        return bool(rank_zero_value(self.reporter.report(step, value)))

    def fail(self, reason: str) -> None:
        self.reporter.fail(reason)  # no collective: a rank may fail alone (the others: no-ops)


def build_reporter(trial: DictConfig, ranks: Ranks) -> Reporter:
    """The trial's reporter (`trial.reporter`, built with the node's other keys) on rank 0;
    NoReporter for a run that is no trial."""
    if trial.reporter is None:
        return NoReporter()
    reporter_class = locate("trial.reporter", trial.reporter)
    own: Reporter = NoReporter()
    if ranks.is_zero:
        own = reporter_class(storage=trial.storage, study=trial.study, number=trial.number)
    return RankZeroReporter(own) if ranks.world_size > 1 else own
