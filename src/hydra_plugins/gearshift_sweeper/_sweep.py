"""The machinery of `hydra/sweeper=gearshift_optuna` (sweeper.py, the plugin, hands each
sweep to `StudySweeper`): an Optuna (>= 4) study driven by ask and tell.

- Trials run side by side, up to `n_jobs` at once, each through the configured launcher
  (`launcher.launch([its overrides], its number)`, one call per trial from a pool of
  `n_jobs` threads): when one ends, the next is asked for at once; no batch waits for its
  slowest trial. The study is asked and told on the sweep's own thread only.
- The study lives in a journal file, `<sweep dir>/study.journal` by default (Optuna's
  JournalStorage: a plain append-only file, fine on a shared file system). Running the same
  command with the same `hydra.sweep.dir` continues it: finished trials stay, `n_trials` is
  the total, and the sampler's stream goes on (seeded from `seed` and the trials in the
  storage: it never asks the points of an earlier run again). A trial that was running when
  the sweep died is waited for while its process still holds its run folder (the run
  folder's lock: one writer), counted when it ended with its summary.json, and otherwise
  launched again under its own number, where `resume=auto` continues from its checkpoint.
  (The processes launcher stops a trial whose sweep is gone at its next step, with a save.)
- A failed trial stays failed: its run marks it FAIL in the storage the moment it fails,
  with its reason (user attribute `failure`: its `error:` line), so a sweep killed before it
  noticed does not launch it again; a failure the run could not record (it crashed, it was
  killed) is recorded when the sweep notices it: the launcher's last `error:` line of the
  process, or its exit status. A study in which no trial completed ends with one
  `error:` line naming the first failure, and exit 1.
- A launcher that submits jobs (hydra/launcher=slurm: `submit`, `rejoin`) gets each trial
  submitted on the sweep's thread, and the trial records its job's id (`slurm_jobs`) before
  anything waits on it; on a rerun, a trial whose job still runs (or ended with its result)
  is waited for, not launched beside it. A local launcher with `use_slots` (processes) gets
  `n_jobs` device slots first, one per trial in flight.
- Each trial's run gets the `trial` node (its storage, study name and number, and the
  reporter class): the run reports its monitor at every validation, and the pruner can
  stop it (summary.json's `stop_reason: pruned`); the sweeper then tells the study PRUNED.

Trial number = Hydra job number = run folder name (`<sweep dir>/<number>`).
"""

import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from functools import partial
from pathlib import Path
from typing import Any

from hydra.core.plugins import Plugins
from hydra.core.utils import JobStatus
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.gearshift_sweeper._search_space import SearchSpaceError, parse_search_space
from hydra_plugins.gearshift_sweeper._study import (
    PRUNER_KEY,
    StudyError,
    build_pruner,
    build_sampler,
    check_journal_path,
    check_sampler,
    grid_size,
    journal_path,
    open_storage,
)
from hydra_plugins.gearshift_sweeper._study_reporter import FAILURE, PRUNED_AT

log = logging.getLogger(__name__)

DIRECTIONS = ("minimize", "maximize")
LIVE_TRIALS = ("wait", "stop")  # what a rerun does with a trial whose process still runs
EXIT_BAD_CONFIG = 2
EXIT_NOTHING_COMPLETED = 1  # every trial failed (or was pruned): the first failure's line
REPORTER = "hydra_plugins.gearshift_sweeper._study_reporter.OptunaReporter"
SLURM_JOBS = "slurm_jobs"  # a trial's user attribute: the ids of the SLURM jobs it had


class StudySweeper(Sweeper):
    def __init__(self, **params: Any) -> None:
        # plain values: the nodes come as DictConfigs, resolved against the whole config
        self.params = {
            k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
            for k, v in params.items()
        }
        self.config: DictConfig | None = None
        self.launcher: Any = None
        self.config_loader: Any = None
        self.space: Any = None  # the search space, once the sweep has checked it
        self.trial_node: dict[str, Any] = {}  # what every trial's `trial` node holds
        self.storage: Any = None  # the study's storage, once the sweep has opened it

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config = config
        self.config_loader = hydra_context.config_loader
        launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )
        # gearshift's launchers hand their work to an implementation (gearshift_launcher LazyPlugin);
        # the sweep talks to that directly: it adds use_slots (processes), submit, rejoin (slurm)
        self.launcher = getattr(launcher, "impl", launcher)

    def sweep(self, arguments: list[str]) -> Any:
        import optuna
        from optuna.trial import TrialState

        # Optuna's lines go where the sweep's go (Hydra's log: stdout and the sweep's log
        # file), not to stderr, where a sweep that fails ends with one line
        optuna.logging.disable_default_handler()
        optuna.logging.enable_propagation()
        p = self.params
        try:
            self.space, journal = self.check(arguments)
        except (SearchSpaceError, StudyError) as error:
            print(f"error: {error}", file=sys.stderr)
            raise SystemExit(EXIT_BAD_CONFIG) from None
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        storage_url = str(journal) if journal is not None else p["storage"]
        self.storage = storage = open_storage(storage_url)
        study = self.open_study(storage)
        self.trial_node = {"storage": storage_url, "study": p["study_name"]}
        trials = [t for t in study.get_trials(deepcopy=False) if t.state != TrialState.WAITING]
        interrupted = [t for t in trials if t.state == TrialState.RUNNING]
        to_ask = max(self.n_trials() - len(trials), 0)
        log.info(
            "study %r in %s: %d trials so far, %d to resume, %d to ask for, %d at once",
            p["study_name"], storage_url, len(trials), len(interrupted), to_ask, p["n_jobs"],
        )  # fmt: skip
        with ThreadPoolExecutor(max_workers=p["n_jobs"], thread_name_prefix="trial") as pool:
            running: dict[Future, int] = {}
            while interrupted or to_ask or running:
                while len(running) < p["n_jobs"] and (interrupted or to_ask):
                    if interrupted:
                        trial = interrupted.pop(0)
                        waiting = self.continue_trial(storage, sweep_dir, trial)
                    else:
                        study.sampler = self.sampler_for(study)
                        trial, to_ask = study.ask(self.space.distributions), to_ask - 1
                        overrides = self.trial_overrides(trial.number, trial.params)
                        waiting = self.start(storage, trial.number, overrides)
                    running[pool.submit(waiting)] = trial.number
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    self.tell(study, running.pop(future), future)
        return self.finish(study, sweep_dir)

    def open_study(self, storage: Any) -> Any:
        """The study in `storage`, created with the given points first when it is new."""
        import optuna

        p = self.params
        pruner_args = given(p.get("pruner_args"))
        study = optuna.create_study(
            study_name=p["study_name"],
            storage=storage,
            sampler=self.sampler_for(None),
            pruner=build_pruner(p["pruner"], pruner_args),
            direction=p["direction"],
            load_if_exists=True,
        )
        study.set_user_attr(PRUNER_KEY, {"name": p["pruner"], "args": pruner_args})
        if not study.get_trials(deepcopy=False):
            for params in p.get("enqueue") or []:
                study.enqueue_trial(params)
        return study

    def n_trials(self) -> int:
        """The study's size: `n_trials`, or the grid's when the grid sampler walks fewer."""
        n_trials = self.params["n_trials"]
        if self.params["sampler"] == "grid" and n_trials > grid_size(self.space.grid):
            n_trials = grid_size(self.space.grid)
            log.info("sampler grid: %d trials, one per point of the grid", n_trials)
        return n_trials

    def continue_trial(self, storage: Any, sweep_dir: Path, trial: Any) -> Callable[[], Any]:
        """What waits for a trial that was running when the sweep died: its SLURM job when
        that still runs, its process when that still holds the run folder, else the trial
        launched again, where `resume=auto` continues from its checkpoint."""
        waiting = self.rejoin(trial) or self.follow(sweep_dir, trial)
        if waiting is not None:
            return waiting
        log.info("trial %d: resumed (it was running when the sweep ended)", trial.number)
        return self.start(storage, trial.number, self.trial_overrides(trial.number, trial.params))

    def check(self, arguments: list[str]) -> tuple[Any, Path | None]:
        """Every setting, before anything is written: bad input ends the sweep with one line."""
        from hydra._internal.core_plugins.basic_launcher import BasicLauncher

        p = self.params
        space = parse_search_space(p.get("params"), arguments)
        check_sampler(p["sampler"], space.not_gridded)
        build_pruner(p["pruner"], given(p.get("pruner_args")))
        if p["direction"] not in DIRECTIONS:
            raise StudyError(
                f"hydra.sweeper.direction={p['direction']!r} is not allowed; choose one of: "
                f"{', '.join(DIRECTIONS)}"
            )
        if p["live_trials"] not in LIVE_TRIALS:
            raise StudyError(
                f"hydra.sweeper.live_trials={p['live_trials']!r} is not allowed; choose one of: "
                f"{', '.join(LIVE_TRIALS)}"
            )
        for key in ("n_trials", "n_jobs"):
            if not isinstance(p[key], int) or p[key] < 1:
                raise StudyError(f"hydra.sweeper.{key}={p[key]!r} is not allowed; an integer >= 1")
        if p["n_jobs"] > 1 and isinstance(self.launcher, BasicLauncher):
            raise StudyError(
                f"hydra.sweeper.n_jobs={p['n_jobs']} is not allowed with hydra/launcher=basic, "
                "which runs jobs inside the sweep's process; use hydra/launcher=processes or slurm"
            )
        use_slots = getattr(self.launcher, "use_slots", None)  # hydra/launcher=processes
        if use_slots is not None:
            try:
                use_slots(p["n_jobs"])  # a device slot for each trial in flight
            except ValueError as error:
                raise StudyError(str(error)) from None
        journal = journal_path(p.get("storage"), Path(str(self.config.hydra.sweep.dir)))
        if journal is not None:
            check_journal_path(journal.absolute())
        self.check_keys(space)
        return space, journal

    def check_keys(self, space: Any) -> None:
        """Every searched key names a config key (or group): a trial's config, composed the
        way the launcher will with a value of each, or one line naming the key."""
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        for key, distribution in space.distributions.items():
            value = override_value(first_value(distribution))
            try:
                self.config_loader.load_sweep_config(self.config, [*space.fixed, f"{key}={value}"])
            except (HydraException, OmegaConfBaseException) as error:
                cause = error.__cause__ or error
                reason = next((ln.strip() for ln in str(cause).splitlines() if ln.strip()), "")
                raise SearchSpaceError(
                    f"hydra.sweeper.params.{key} is not allowed; no trial could set "
                    f"{key}={value}: {reason}"
                ) from None

    def start(self, storage: Any, number: int, overrides: list[str]) -> Callable[[], Any]:
        """Launch trial `number`; returns what waits for its result (on a pool thread).

        A launcher that submits jobs to a scheduler (hydra/launcher=slurm: `submit`) submits
        here, on the sweep's thread, and the trial records the job's id (user attribute
        `slurm_jobs`, every job it had) before anything waits on it: a rerun of a sweep that
        died finds the job again. Any other launcher runs the trial in its `launch` call."""
        submit = getattr(self.launcher, "submit", None)
        if submit is None:
            return partial(self.launch_one, overrides, number)
        job = submit(overrides, number)
        trial_id = self.trial_id(number)
        jobs = storage.get_trial(trial_id).user_attrs.get(SLURM_JOBS, [])
        storage.set_trial_user_attr(trial_id, SLURM_JOBS, [*jobs, job.job_id])
        return partial(first_result, job)

    def rejoin(self, trial: Any) -> Callable[[], Any] | None:
        """What waits for the job of a trial that was running when the sweep died, when that
        job still runs (or ended with its result while no sweep waited); None when it is gone,
        or the launcher runs no jobs of its own: the trial is launched again."""
        jobs = trial.user_attrs.get(SLURM_JOBS)
        rejoin = getattr(self.launcher, "rejoin", None)
        if not jobs or rejoin is None:
            return None
        job = rejoin(jobs[-1])
        if job is None:
            return None
        log.info(
            "trial %d: its SLURM job %s outlived the sweep: waiting for it",
            trial.number,
            job.job_id,
        )
        return partial(first_result, job)

    def trial_overrides(self, number: int, params: dict[str, Any]) -> list[str]:
        """Trial `number`'s command line: the fixed overrides, its values, its `trial` node."""
        chosen = [f"{key}={override_value(value)}" for key, value in params.items()]
        node = self.trial_node | {"number": number, "reporter": REPORTER}
        return [*self.space.fixed, *chosen, *(f"trial.{k}={v}" for k, v in node.items())]

    def sampler_for(self, study: Any | None) -> Any:
        """The sampler for the next trial: seeded from the seed and the number of trials in
        the storage, so that a study continued after a kill asks what the uninterrupted one
        would have, and never the points of its first run again."""
        seed = self.params["seed"]
        asked = 0 if study is None else len(study.get_trials(deepcopy=False))
        seed = None if seed is None else seed + asked
        return build_sampler(self.params["sampler"], seed, self.space.grid)

    def follow(self, sweep_dir: Path, trial: Any) -> Callable[[], Any] | None:
        """What waits for a trial that was running when the sweep died, when its process
        still holds its run folder (a run folder has one writer) or ended with a result
        (summary.json, written at a run's end) while no sweep waited; None when neither:
        the trial is launched again."""
        from gearshift.state.run_lock import holder

        run_dir = sweep_dir / str(trial.number)
        pid = holder(run_dir)
        if pid is None and not (run_dir / "summary.json").exists():
            return None
        if pid is None:
            log.info("trial %d: it ended while no sweep waited: its summary counts", trial.number)
        elif self.params["live_trials"] == "stop":
            log.info("trial %d: its process %s outlived the sweep: stopping it", trial.number, pid)
            os.kill(pid, signal.SIGTERM)  # it saves at its next step; launched again, it resumes
        else:
            log.info("trial %d: its process %s outlived the sweep: waiting", trial.number, pid)
        return partial(self.result_in, run_dir, trial)

    def result_in(self, run_dir: Path, trial: Any) -> Any:
        """The result of the trial whose run folder is `run_dir`, once no process holds it:
        its summary.json's objective; when it stopped without one, a failure if the run
        marked itself failed, else the trial launched again to resume."""
        from hydra.core.utils import JobReturn
        from optuna.trial import TrialState

        from gearshift.app import objective
        from gearshift.state.run_lock import holder

        holder(run_dir, wait=True)  # until the trial's process ended
        summary = run_dir / "summary.json"
        if summary.exists():
            result = JobReturn(status=JobStatus.COMPLETED)
            result.return_value = objective(json.loads(summary.read_text()))
            return result
        if self.storage.get_trial(self.trial_id(trial.number)).state == TrialState.FAIL:
            raise RuntimeError(f"trial {trial.number} failed")  # `tell` says why: its `failure`
        log.info("trial %d: resumed (its process stopped before the end)", trial.number)
        return self.launch_one(self.trial_overrides(trial.number, trial.params), trial.number)

    def launch_one(self, overrides: list[str], number: int) -> Any:
        """One trial through the launcher (on a pool thread): it returns when the run ends."""
        [result] = self.launcher.launch([overrides], initial_job_idx=number)
        return result

    def trial_id(self, number: int) -> int:
        """Trial `number`'s id in the storage."""
        study_id = self.storage.get_study_id_from_name(self.params["study_name"])
        return self.storage.get_trial_id_from_study_id_trial_number(study_id, number)

    def tell(self, study: Any, number: int, future: Future) -> None:
        """Tell the study how trial `number` ended; a failure with its reason (user attribute
        `failure`: the run's own, when it marked itself failed, else the launcher's)."""
        from optuna.trial import TrialState

        try:
            result = future.result()
            if result.status == JobStatus.FAILED:
                result.return_value  # noqa: B018  (raises the job's exception)
            value = float(result.return_value)
        except BaseException as error:  # a failed run, or a job the launcher lost
            trial_id = self.trial_id(number)
            trial = self.storage.get_trial(trial_id)
            reason = trial.user_attrs.get(FAILURE) or failure_reason(error)
            if trial.state == TrialState.RUNNING:  # else the run marked itself failed
                self.storage.set_trial_user_attr(trial_id, FAILURE, reason)
                study.tell(number, state=TrialState.FAIL)
            log.error("trial %d failed: %s", number, reason)
            return
        attrs = study.get_trials(deepcopy=False)[number].user_attrs
        if PRUNED_AT in attrs:
            study.tell(number, state=TrialState.PRUNED)
            log.info("trial %d pruned at step %d", number, attrs[PRUNED_AT])
        else:
            study.tell(number, value)
            log.info("trial %d: %s", number, value)

    def finish(self, study: Any, sweep_dir: Path) -> Any:
        """The report (study_report.md and its plots) and optimization_results.yaml, the
        best trial; when no trial completed, one line with the first failure's reason and
        exit 1."""
        from optuna.trial import TrialState

        from hydra_plugins.gearshift_sweeper._report import write_report

        log.info("report: %s", write_report(study, sweep_dir))

        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if not complete:
            print(f"error: {nothing_completed(study)}", file=sys.stderr)
            raise SystemExit(EXIT_NOTHING_COMPLETED)
        best = study.best_trial
        results = {
            "name": study.study_name,
            "best_trial": best.number,
            "best_params": best.params,
            "best_value": best.value,
        }
        OmegaConf.save(OmegaConf.create(results), sweep_dir / "optimization_results.yaml")
        log.info("best trial %d: %s = %s", best.number, best.params, best.value)
        return results


def failure_reason(error: BaseException) -> str:
    """Why a trial failed, in one line: the last `error:` line in what the launcher raised
    (a job's process that printed one), else its last line, named by its type."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    said = [line.removeprefix("error:").strip() for line in lines if line.startswith("error:")]
    if said:
        return said[-1]
    if getattr(error, "one_line", False):  # the launcher's own reason (_processes.JobFailed)
        return lines[-1]
    return f"{type(error).__name__}: {lines[-1]}" if lines else type(error).__name__


def nothing_completed(study: Any) -> str:
    """The line a study in which no trial completed ends with: the first failure's reason."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    failed = [t for t in trials if t.state == TrialState.FAIL]
    said = f"no trial of study {study.study_name!r} completed"
    if not failed:
        pruned = sum(t.state == TrialState.PRUNED for t in trials)
        return f"{said} ({pruned} pruned, of {len(trials)})"
    first = failed[0]
    reason = first.user_attrs.get(FAILURE, "no reason recorded")
    return (
        f"{said}; {len(failed)} of {len(trials)} failed, the first, trial {first.number}: {reason}"
    )


def first_result(job: Any) -> Any:
    """A submitted job's JobReturn (its first task's: rank 0 of a multi-task job), when it
    ends; raises when the job died without one."""
    return job.results()[0]


def first_value(distribution: Any) -> Any:
    """A value `distribution` can take: its first choice, or its low end."""
    choices = getattr(distribution, "choices", None)
    return choices[0] if choices is not None else distribution.low


def given(args: dict[str, Any] | None) -> dict[str, Any]:
    """The keyword arguments set (not null)."""
    return {key: value for key, value in (args or {}).items() if value is not None}


def override_value(value: Any) -> str:
    """A sampled value as a command-line override's value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
