"""A study's trial as the run's reporter (observe/trial.py's seam): the class
`trial.reporter` names, built on rank 0 with the `trial` node's other keys, and with
several ranks its answers given to every rank. Loaded only in a run that is a trial (the
sweeper sets `trial.reporter`)."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from gearshift.config.rules import locate
from gearshift.parallel.distributed import Ranks
from gearshift.parallel.process_group import rank_zero_value


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


def trial_reporter(trial: DictConfig, ranks: Ranks) -> Any:
    """The reporter of `trial` (a Reporter, observe/trial.py): `trial.reporter`'s class on
    rank 0; several ranks: behind RankZeroReporter."""
    reporter_class = locate("trial.reporter", trial.reporter)
    own = None
    if ranks.is_zero:
        own = reporter_class(storage=trial.storage, study=trial.study, number=trial.number)
    return RankZeroReporter(own) if ranks.world_size > 1 else own
