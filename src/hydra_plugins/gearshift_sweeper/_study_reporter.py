"""A trial's reporter: the run's validations, told to its trial in the study.

build.py builds it from the run's `trial` node (`trial.reporter` names this class; the
sweeper sets the node for each trial it launches), in the trial's own process: it loads the
study from the sweep's storage, reports the task's monitor at every validation, and says
whether the study's pruner stops the trial there. The sweeper tells the study that a trial
ended (and how), except a failure, which the trial marks itself, with its reason (user
attribute `failure`), the moment it fails: a sweep killed before it noticed does not launch
the trial again.
"""

from __future__ import annotations

import logging
import math

from hydra_plugins.gearshift_sweeper._study import PRUNER_KEY, build_pruner, open_storage

log = logging.getLogger(__name__)

PRUNED_AT = "pruned_at_step"  # the trial's user attribute: the step the pruner stopped it at
FAILURE = "failure"  # the trial's user attribute: why it failed (its one line)


class OptunaReporter:
    def __init__(self, storage: str, study: str, number: int) -> None:
        import optuna

        self.storage = open_storage(storage)
        study_id = self.storage.get_study_id_from_name(study)
        spec = self.storage.get_study_user_attrs(study_id).get(PRUNER_KEY, {"name": "none"})
        pruner = build_pruner(spec["name"], spec.get("args") or {})
        self.study = optuna.load_study(study_name=study, storage=self.storage, pruner=pruner)
        self.trial_id = self.storage.get_trial_id_from_study_id_trial_number(study_id, number)
        self.trial = optuna.trial.Trial(self.study, self.trial_id)
        self.number = number

    def report(self, step: int, value: float | None) -> bool:
        """Report `value` at `step`; True when the pruner stops the trial here."""
        if value is None or not math.isfinite(value):
            return False
        self.trial.report(value, step)
        if not self.trial.should_prune():
            return False
        self.storage.set_trial_user_attr(self.trial_id, PRUNED_AT, step)
        log.info("trial %d pruned at step %d (%s)", self.number, step, value)
        return True

    def fail(self, reason: str) -> None:
        """Mark the trial failed, with `reason`; a study that cannot be written to is logged,
        not raised: the run's own failure is the one to report."""
        from optuna.trial import TrialState

        try:
            self.storage.set_trial_user_attr(self.trial_id, FAILURE, reason)
            self.storage.set_trial_state_values(self.trial_id, TrialState.FAIL)
        except Exception as error:  # the run's own failure is the one to raise
            log.warning(
                "trial %d: its failure was not recorded in the study: %s", self.number, error
            )
