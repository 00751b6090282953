"""Optuna searches as SLURM jobs (hydra/sweeper=gearshift_optuna with hydra/launcher=slurm),
on the cluster of tests/test_slurm.py's fixture: trials in flight as jobs, pruning, a killed
search that waits for its live jobs. Deleting the Optuna sweeper deletes this file with it."""

from __future__ import annotations

import json
import os
import pickle
import shlex
import signal

import optuna
import pytest
import test_slurm
from helpers import ROOT, seconds
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState
from test_slurm import (  # noqa: F401  (slurm_cluster: the session's cluster fixture)
    Sweep,
    slurm_cluster,
    training_pids,
    wait_for,
)

# the SLURM tests' worker: they share the cluster's two nodes
pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm")]
sweep = test_slurm.sweep  # the fixture: a sweep in its own folder, its jobs cancelled after

SEARCH = ("hparams_search=lr_batch", "warmup_steps=0", "batch_size=choice(32)")


def study(sweep: Sweep) -> optuna.Study:
    storage = JournalStorage(JournalFileBackend(str(sweep.dir / "study.journal")))
    return optuna.load_study(study_name="lr_batch", storage=storage)


def trials_now(sweep: Sweep) -> list:
    """The study's trials as the journal holds them now (none before it exists)."""
    if not (sweep.dir / "study.journal").exists():
        return []
    return study(sweep).get_trials(deepcopy=False)


def trial_of_each_job(sweep: Sweep) -> dict[str, int]:
    """{SLURM job id: the trial it ran}, from what submitit pickled for each job (the
    launcher's call: overrides, the sweep dir's key, the job number, ...)."""
    return {
        path.parent.name: pickle.loads(path.read_bytes()).args[2]
        for path in sweep.dir.glob(".submitit/*/*_submitted.pkl")
    }


def hold(job: str) -> list[int]:
    """Stop the job's training processes (SIGSTOP): SLURM still runs the job."""
    pids = training_pids(f"SLURM_JOB_ID={job}")
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    return pids


def release(pids: list[int]) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGCONT)


def job_of(sweep: Sweep, number: int) -> str:
    """The SLURM job the sweeper recorded for trial `number` (its newest)."""
    return trials_now(sweep)[number].user_attrs["slurm_jobs"][-1]


def summary_of(sweep: Sweep, number: int) -> dict:
    return json.loads((sweep.dir / str(number) / "summary.json").read_text())


def readme_slurm_search() -> list[str]:
    """The overrides of docs/optuna.md's Optuna-on-SLURM command."""
    section = (ROOT / "docs" / "optuna.md").read_text()
    block = section.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    lines = [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]
    [words] = [w for w in lines if "hydra/launcher=slurm" in w]
    assert words[:4] == ["python", "train.py", "-m", "hparams_search=lr_batch"]
    return words[4:]


@pytest.mark.timeout(seconds(300))
def test_an_optuna_search_keeps_two_slurm_jobs_in_flight_and_prunes(sweep):
    # docs/optuna.md's command, made small (later overrides win). Trial 0 is held (SIGSTOP) from
    # the moment it starts until trial 1 has ended and trial 2, asked at that moment, has
    # been pruned: trials in flight, no batch barrier, whatever the machine's speed.
    sweep.start(
        *readme_slurm_search(),
        *SEARCH,
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.n_jobs=2",
        "hydra.sweeper.pruner_args.n_startup_trials=1",
        "hydra.sweeper.enqueue=[{optimizer.lr: 0.1, max_steps: 2}, "
        "{optimizer.lr: 0.1, max_steps: 12}, {optimizer.lr: 0.00000001, max_steps: 12}]",
        "optimizer.lr=choice(0.1, 0.00000001)",
        "max_steps=choice(2, 12)",
        "val_every_n_steps=3",
        f"hydra.sweep.dir={sweep.dir}",
    )
    wait_for(lambda: (sweep.dir / "0" / ".hydra").is_dir(), 120, "trial 0 to start")
    held = hold(job_of(sweep, 0))
    try:
        wait_for(
            lambda: len(trials := trials_now(sweep)) == 3 and trials[2].state.is_finished(),
            150,
            "trial 1 to end and trial 2 to run and end",
        )
    finally:
        release(held)
    code, output = sweep.finish(timeout=150)
    assert code == 0, output
    t0, t1, t2 = trials = study(sweep).trials
    assert t2.datetime_start >= t1.datetime_complete  # asked when trial 1 ended,
    assert t2.datetime_complete <= t0.datetime_complete  # while trial 0 still ran
    assert (t0.state, t1.state, t2.state) == (
        TrialState.COMPLETE,
        TrialState.COMPLETE,
        TrialState.PRUNED,
    )
    pruned = summary_of(sweep, 2)  # the hopeless learning rate stopped at a validation
    assert pruned["stop_reason"] == "pruned" and pruned["steps"] < 12 and pruned["steps"] % 3 == 0
    assert t2.user_attrs["pruned_at_step"] == pruned["steps"]
    assert summary_of(sweep, 1)["steps"] == 12 and summary_of(sweep, 0)["steps"] == 2
    best = max((t0, t1), key=lambda t: summary_of(sweep, t.number)["best"]["value"])
    assert study(sweep).best_value == pytest.approx(best.value)
    # one SLURM job per trial, each run to its end (the pruned one too: it exits 0)
    jobs = trial_of_each_job(sweep)
    assert sorted(jobs.values()) == [0, 1, 2]
    assert all(jobs[t.user_attrs["slurm_jobs"][0]] == t.number for t in trials)
    wait_for(lambda: set(sweep.jobs().values()) == {"COMPLETED"}, 60, "the jobs to complete")


@pytest.mark.timeout(seconds(360))
def test_a_killed_optuna_search_waits_for_its_live_jobs_and_relaunches_the_dead(sweep):
    search = (
        *SEARCH,
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.n_jobs=2",
        "max_steps=100",
        "checkpoint.every_n_steps=10",
    )
    sweep.start(*search)
    # trial 0 holds (SIGSTOP) as it starts, trial 1 at its first checkpoint; then the sweep
    # dies: both jobs live on, held whatever the machine's speed
    held: dict[int, list[int]] = {}
    submitted = lambda: sum("slurm_jobs" in t.user_attrs for t in trials_now(sweep)) == 2  # noqa: E731
    wait_for(submitted, 60, "trials 0 and 1 to be submitted")
    first_jobs = {n: job_of(sweep, n) for n in (0, 1)}  # recorded before anything waits

    def hold_both() -> bool:
        if 0 not in held and (sweep.dir / "0" / ".hydra").is_dir():
            held[0] = hold(first_jobs[0])
        if 1 not in held and any((sweep.dir / "1").glob("checkpoints/step_*")):
            held[1] = hold(first_jobs[1])
        return len(held) == 2

    try:
        wait_for(hold_both, 150, "trial 0 to start, trial 1 to checkpoint", poll_s=0.01)
        os.killpg(sweep.process.pid, signal.SIGKILL)
        sweep.process.wait()
        assert set(sweep.jobs().values()) == {"RUNNING"}  # the jobs outlive their sweep
        # trial 1's job dies too (killed, as by the OOM killer: no result); trial 0's lives on
        for pid in held.pop(1):
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: sweep.jobs()[first_jobs[1]] == "FAILED", 60, "trial 1's job to fail")
        saved = sorted((sweep.dir / "1" / "checkpoints").glob("step_*"))
        step_at_kill = int(saved[-1].stem.split("_")[-1])

        sweep.start(*search)  # the same command again
        relaunched = lambda: len(trials_now(sweep)[1].user_attrs["slurm_jobs"]) == 2  # noqa: E731
        wait_for(relaunched, 120, "trial 1 to be launched again")
    finally:
        release(held.pop(0, []))
    code, output = sweep.finish(timeout=200)
    assert code == 0, output
    assert f"trial 0: its SLURM job {first_jobs[0]} outlived the sweep: waiting for it" in output
    trials = study(sweep).trials
    assert [t.number for t in trials] == [0, 1, 2]  # n_trials in all, none asked twice
    assert all(t.state == TrialState.COMPLETE for t in trials)
    jobs = trial_of_each_job(sweep)  # what SLURM ran, from submitit's own files
    runs = {n: sorted(j for j, t in jobs.items() if t == n) for n in (0, 1, 2)}
    assert runs[0] == [first_jobs[0]]  # waited for, not launched beside its live job
    assert len(runs[1]) == 2 and runs[1][0] == first_jobs[1]  # the dead one: launched again
    assert len(runs[2]) == 1
    assert sweep.jobs()[first_jobs[1]] == "FAILED"
    others = (*runs[0], runs[1][1], *runs[2])
    wait_for(lambda: {sweep.jobs()[j] for j in others} == {"COMPLETED"}, 60, "the others to end")
    for n in (0, 1, 2):
        assert summary_of(sweep, n)["steps"] == 100
        log = (sweep.dir / str(n) / "train.log").read_text()  # one writer: each step saved once
        saved = [
            line.split("checkpoint: ")[1] for line in log.splitlines() if "checkpoint: " in line
        ]
        assert saved and len(saved) == len(set(saved)), saved
    assert len({t.params["optimizer.lr"] for t in trials}) == 3  # the rerun asked a new point
    log = (sweep.dir / "1" / "train.log").read_text()  # trial 1 went on from its checkpoint
    assert f"step_{step_at_kill:09d} at step {step_at_kill}" in log, log
    assert "resumed from" not in (sweep.dir / "0" / "train.log").read_text()  # never stopped
