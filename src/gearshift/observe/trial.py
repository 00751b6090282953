"""Where a run reports its validations beyond its own logs: a study's trial.

A run that is one trial of a hyper-parameter search (the sweeper sets the `trial` node)
tells its trial the task's monitor at every validation, and the study's pruner may answer
"stop here"; a run that fails tells its trial why, the moment it fails. The reporter that
talks to the study is named by `trial.reporter` and imported only then, with the machinery
that builds it (observe/trial_reporter.py), so the training loop's layers never import a
search library and a run that is no trial loads only this seam.
"""

from __future__ import annotations

from typing import Protocol

from omegaconf import DictConfig

from gearshift.parallel.distributed import Ranks


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


def build_reporter(trial: DictConfig, ranks: Ranks) -> Reporter:
    """The trial's reporter (`trial.reporter`, built with the node's other keys) on rank 0;
    NoReporter for a run that is no trial."""
    if trial.reporter is None:
        return NoReporter()
    from gearshift.observe.trial_reporter import trial_reporter  # a trial's run only

    return trial_reporter(trial, ranks)
