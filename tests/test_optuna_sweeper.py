"""The Optuna sweeper (hydra/sweeper=gearshift_optuna) with the local process launcher:
trials side by side without a batch barrier, pruning, a study that survives a killed sweep,
and bad input."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from concurrent.futures import Future

import optuna
import pytest
import yaml
from helpers import CONF, ROOT, holding_process, seconds, train_in_process
from hydra import compose, initialize_config_dir
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState
from test_sweeps import TINY as SWEEP_TINY  # the sweeps' small run; the preset picks batch_size

from gearshift.state import run_lock
from gearshift.state.checkpoint_folders import latest_checkpoint
from hydra_plugins.gearshift_sweeper._report import main as report_main
from hydra_plugins.gearshift_sweeper._report import write_report
from hydra_plugins.gearshift_sweeper._search_space import parse_search_space
from hydra_plugins.gearshift_sweeper._study import open_storage
from hydra_plugins.gearshift_sweeper._sweep import StudySweeper
from hydra_plugins.gearshift_sweeper.sweeper import OptunaSweeperConf

TINY = (
    "hparams_search=lr_batch",
    "logger=none",
    "model=mlp",
    "progress_bar=false",
    "data.num_samples=256",
    "data.num_val_samples=64",
    "data.image_size=16",
    "warmup_steps=0",
    "batch_size=32",
)


def env(tmp_path) -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": "offline", "HOME": str(tmp_path)}


def command(*overrides: str) -> list[str]:
    return [sys.executable, str(ROOT / "train.py"), "-m", *TINY, *overrides]


def sweep(
    tmp_path, *overrides: str, timeout: float = 600, environment: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        command(*overrides),
        cwd=tmp_path,
        env=environment or env(tmp_path),
        capture_output=True,
        text=True,
        timeout=seconds(timeout),
    )


def sweep_in_process(
    tmp_path, *overrides: str, environment: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """sweep() run inside this process (train_in_process), where the test is not about the
    sweep's own process: its start (seconds of imports) is saved; its trials are processes."""
    return train_in_process("-m", *TINY, *overrides, cwd=tmp_path, env=environment or env(tmp_path))


def load(sweep_dir, name: str = "lr_batch") -> optuna.Study:
    storage = JournalStorage(JournalFileBackend(str(sweep_dir / "study.journal")))
    return optuna.load_study(study_name=name, storage=storage)


def summary(sweep_dir, number: int) -> dict:
    return json.loads((sweep_dir / str(number) / "summary.json").read_text())


def run_span(run_dir) -> tuple[float, float]:
    """When a run wrote its config and its summary: inside its process's lifetime."""
    began = (run_dir / ".hydra" / "config.yaml").stat().st_mtime
    return began, (run_dir / "summary.json").stat().st_mtime


def test_trials_run_side_by_side_and_the_best_is_the_best_run(tmp_path):
    sweep_dir = tmp_path / "search"
    done = sweep_in_process(
        tmp_path,
        "hydra.sweeper.n_trials=5",  # the check below misses only if two pairs end at once
        "hydra.sweeper.n_jobs=2",
        "hydra.sweeper.sampler=random",
        "batch_size=choice(32)",
        # a command-line sweep is searched too: fast trials and slow ones (about a second
        # more: trials that end apart, even on a busy machine)
        "max_steps=choice(2, 1000)",
        f"hydra.sweep.dir={sweep_dir}",
    )
    assert done.returncode == 0, done.stderr
    trials = load(sweep_dir).trials
    assert [t.number for t in trials] == list(range(5))
    assert all(t.state == TrialState.COMPLETE for t in trials)
    # No batch barrier: some trial was asked for after one trial ended while another, which
    # began before that end, still ran. Batches of two never do that: a batch starts when
    # both trials of the last one have ended.
    spans = [(t.datetime_start, t.datetime_complete) for t in trials]
    assert any(
        r_end <= t_start < s_end and s_start < r_end
        for (_, r_end) in spans
        for (s_start, s_end) in spans
        for (t_start, _) in spans
    ), spans
    # each trial in its own device slot: trials whose runs overlapped (from writing their
    # config to writing their summary) ran on disjoint cores, with as many torch threads
    cores = {
        t.number: set(summary(sweep_dir, t.number)["environment"]["cpu_cores"]) for t in trials
    }
    ran = {n: run_span(sweep_dir / str(n)) for n in cores}
    overlapped = [
        (a, b) for a in ran for b in ran if a < b and ran[a][0] < ran[b][1] and ran[b][0] < ran[a][1]
    ]  # fmt: skip
    assert overlapped, ran
    for a, b in overlapped:
        assert not cores[a] & cores[b], (a, cores[a], b, cores[b])
    usable = len(os.sched_getaffinity(0))  # 2 cores here: 1 each
    for t in trials:
        threads = summary(sweep_dir, t.number)["environment"]["torch_threads"]
        assert len(cores[t.number]) == threads in (usable // 2, usable - usable // 2)
    for t in trials:  # each trial's run trained with the values the study holds for it
        s = summary(sweep_dir, t.number)
        assert s["steps"] == t.params["max_steps"]
        assert s["best"]["value"] == pytest.approx(t.value)
        assert s["stop_reason"] == "completed"
    best = max(trials, key=lambda t: summary(sweep_dir, t.number)["best"]["value"])
    assert load(sweep_dir).best_value == pytest.approx(best.value)  # maximize: val_accuracy
    assert load(sweep_dir).direction == optuna.study.StudyDirection.MAXIMIZE
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert results["best_value"] == pytest.approx(best.value)
    assert results["best_params"] == best.params


def test_the_median_pruner_stops_a_hopeless_trial_after_its_first_validations(tmp_path):
    sweep_dir = tmp_path / "search"
    done = sweep(
        tmp_path,
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.pruner=median",
        "hydra.sweeper.pruner_args.n_startup_trials=1",
        # a learning rate that learns, then one that learns nothing in 12 steps
        "hydra.sweeper.enqueue=[{optimizer.lr: 0.1}, {optimizer.lr: 0.00000001}]",
        "optimizer.lr=choice(0.1, 0.00000001)",
        "batch_size=choice(32)",
        "max_steps=12",
        "val_every_n_steps=3",
        f"hydra.sweep.dir={sweep_dir}",
    )
    assert done.returncode == 0, done.stderr
    trials = load(sweep_dir).trials
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert trials[1] in pruned, [(t.params, t.state) for t in trials]
    for t in pruned:
        s = summary(sweep_dir, t.number)
        assert t.params["optimizer.lr"] < 1e-6  # only the hopeless ones
        assert s["stop_reason"] == "pruned"
        assert s["steps"] < 12 and s["steps"] % 3 == 0  # stopped at a validation
        assert t.user_attrs["pruned_at_step"] == s["steps"]
        assert sorted(t.intermediate_values) == list(range(3, s["steps"] + 1, 3))
        assert list((sweep_dir / str(t.number) / "checkpoints").glob("step_*"))  # it saved
    for t in trials:
        if t.state == TrialState.COMPLETE:
            assert summary(sweep_dir, t.number)["steps"] == 12


def test_a_sigkilled_sweep_stops_its_trials_and_the_rerun_goes_on_as_one_study(tmp_path):
    sweep_dir = tmp_path / "search"
    overrides = (
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.n_jobs=2",
        "max_steps=100",  # the kill comes at step 10: a trial is midway
        "checkpoint.every_n_steps=10",
        f"hydra.sweep.dir={sweep_dir}",
    )
    first = subprocess.Popen(
        command(*overrides),
        cwd=tmp_path,
        env=env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # the sweep and its trials: one group, to clean up
    )
    deadline = time.monotonic() + seconds(300)
    while not list(sweep_dir.glob("*/checkpoints/step_*")):  # a trial is midway
        assert first.poll() is None and time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    first.kill()  # the sweep alone, by SIGKILL: its trials' processes are not in the kill
    first.wait()
    try:  # each trial noticed, stopped at its next step and saved
        while any(run_lock.holder(run) is not None for run in sweep_dir.glob("[0-9]*")):
            assert time.monotonic() < deadline, "a trial outlived its sweep"
            time.sleep(0.1)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # nothing left behind should the test fail
    before = load(sweep_dir).trials
    interrupted = [t.number for t in before if t.state == TrialState.RUNNING]
    assert interrupted, [t.state for t in before]
    steps_at_kill = {}
    for n in interrupted:  # one still building its run just ended
        if saved := latest_checkpoint(sweep_dir / str(n) / "checkpoints"):
            steps_at_kill[n] = int(saved.name.split("_")[-1])
            assert "stopped by SIGTERM" in (sweep_dir / str(n) / "train.log").read_text()
    assert steps_at_kill  # at least one interrupted trial had saved

    again = sweep_in_process(tmp_path, *overrides)  # the rerun: the killed one was a process
    assert again.returncode == 0, again.stderr
    after = load(sweep_dir).trials
    assert [t.number for t in after] == [0, 1, 2]  # none lost, none duplicated
    assert all(t.state == TrialState.COMPLETE for t in after)
    for t in before:  # the interrupted trials kept the values they were asked with
        assert after[t.number].params == t.params
    # the rerun's sampler went on where the first run's stopped: no point asked twice
    assert len({t.params["optimizer.lr"] for t in after}) == 3, [t.params for t in after]
    for n, step in steps_at_kill.items():
        log = (sweep_dir / str(n) / "train.log").read_text()
        assert f"at step {step}" in log and "resumed from" in log  # continued, not restarted
    for t in after:  # one writer per run folder: no checkpoint step written twice
        log = (sweep_dir / str(t.number) / "train.log").read_text()
        saved = [
            line.split("checkpoint: ")[1] for line in log.splitlines() if "checkpoint: " in line
        ]
        assert saved and len(saved) == len(set(saved)), saved
        assert summary(sweep_dir, t.number)["steps"] == 100


def sweeper(tmp_path, **params) -> StudySweeper:
    """The sweeper as Hydra sets it up, for its parts that need no launch."""
    conf = OmegaConf.structured(OptunaSweeperConf(**params))
    made = StudySweeper(**{k: v for k, v in conf.items() if k != "_target_"})
    made.space = parse_search_space(
        {"optimizer.lr": "interval(0.001, 0.5)", "batch_size": "choice(32, 64, 128, 256)"}, []
    )
    made.trial_node = {"storage": str(tmp_path / "study.journal"), "study": "study"}
    return made


def running_trial(number: int, params: dict) -> optuna.trial.FrozenTrial:
    """A trial as a rerun finds it in the storage: running when the sweep died."""
    distributions = {
        "optimizer.lr": optuna.distributions.FloatDistribution(0.001, 0.5),
        "batch_size": optuna.distributions.CategoricalDistribution([32, 64, 128, 256]),
    }
    return optuna.trial.FrozenTrial(
        number=number, state=TrialState.RUNNING, value=None, datetime_start=None,
        datetime_complete=None, params=params, distributions={k: distributions[k] for k in params},
        user_attrs={}, system_attrs={}, intermediate_values={}, trial_id=number,
    )  # fmt: skip


def asked_points(study, made: StudySweeper, n: int) -> list[dict]:
    points = []
    for _ in range(n):  # as the sweep asks: a sampler for each trial, then the result
        study.sampler = made.sampler_for(study)
        trial = study.ask(made.space.distributions)
        study.tell(trial, trial.params["optimizer.lr"] * trial.params["batch_size"])
        points.append(trial.params)
    return points


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_a_seeded_study_continued_by_a_new_sweep_asks_what_the_uninterrupted_one_would(
    tmp_path, sampler
):
    def fresh_study(name: str):  # a new sweep process: a new sweeper, the study from storage
        made = sweeper(tmp_path, sampler=sampler, seed=3)
        storage = open_storage(str(tmp_path / f"{name}.journal"))
        return made, made.open_study(storage)

    made, study = fresh_study("whole")
    whole = asked_points(study, made, 6)
    made, study = fresh_study("killed")
    first = asked_points(study, made, 2)
    made, study = fresh_study("killed")  # the sweep ran again
    rest = asked_points(study, made, 4)
    assert first + rest == whole
    assert len({p["optimizer.lr"] for p in whole}) == 6


def test_a_trial_whose_process_outlived_the_sweep_is_followed_to_its_result(tmp_path):
    run_dir = tmp_path / "0"
    ends = (
        "import json, sys, time\n"
        "from pathlib import Path\n"
        "from gearshift.state import run_lock\n"
        "run = Path(sys.argv[1]); run_lock.hold(run); print('held', flush=True)\n"
        "time.sleep(1)\n"
        "(run / 'summary.json').write_text(json.dumps({'final_loss': 0.25, 'best': {}}))\n"
    )
    trial = subprocess.Popen(
        [sys.executable, "-c", ends, str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    assert trial.stdout.readline().strip() == "held"
    made = sweeper(tmp_path)
    made.launcher = None  # it must launch nothing: the trial runs already
    frozen = running_trial(0, {})
    waiting = made.follow(tmp_path, frozen)
    assert waiting is not None
    result = waiting()
    assert result.return_value == 0.25  # the summary the trial wrote 1 s after it began
    assert trial.wait(timeout=seconds(30)) == 0
    assert made.follow(tmp_path, frozen)().return_value == 0.25  # ended: its result counts
    (run_dir / "summary.json").unlink()
    assert made.follow(tmp_path, frozen) is None  # neither running nor ended: launch it again


def test_asked_to_stop_a_live_trial_the_rerun_stops_it_and_launches_it_to_resume(tmp_path):
    run_dir = tmp_path / "0"
    holding = holding_process(run_dir)
    made = sweeper(tmp_path, live_trials="stop")
    launched = []

    class Launcher:  # records what the sweeper launches, in place of a process per trial
        def launch(self, job_overrides, initial_job_idx):
            launched.append((initial_job_idx, list(job_overrides[0])))
            result = JobReturn(status=JobStatus.COMPLETED)
            result.return_value = 0.5
            return [result]

    made.launcher = Launcher()
    made.storage = open_storage(made.trial_node["storage"])
    optuna.create_study(study_name="study", storage=made.storage).ask()  # trial 0, running
    frozen = running_trial(0, {"optimizer.lr": 0.1, "batch_size": 32})
    result = made.follow(tmp_path, frozen)()
    assert holding.wait(timeout=seconds(30)) == -signal.SIGTERM  # stopped, by its stop signal
    assert result.return_value == 0.5
    [(number, overrides)] = launched  # launched again, once, with its own values
    assert number == 0 and "optimizer.lr=0.1" in overrides and "trial.number=0" in overrides


def test_importances_over_equal_scores_say_no_parameter_changed_the_objective(tmp_path):
    study = optuna.create_study()
    for lr in (0.1, 0.2, 0.3):
        study.add_trial(
            optuna.trial.create_trial(
                params={"optimizer.lr": lr},
                distributions={"optimizer.lr": optuna.distributions.FloatDistribution(0.0, 1.0)},
                value=1.0,
            )
        )
    report = write_report(study, tmp_path).read_text()
    assert "no parameter changed the objective; every completed trial scored 1" in report
    assert not (tmp_path / "param_importances.png").exists()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (  # a searched key that names no config key
            "+hydra.sweeper.params.optimizer.lrr=choice(1,2)",
            "+hydra.sweeper.params.optimizer.lrr=choice(1,2): optimizer.lrr=1 is not allowed; the "
            "optimizer node has no key 'lrr'; closest: lr",
        ),
        (  # a searched key that exists, given where Hydra takes no sweep
            "hydra.sweeper.params.optimizer.lr=choice(0.1,0.2)",
            "search a key on the command line as optimizer.lr=choice(0.1,0.2)",
        ),
        (  # one the command line cannot catch: found when the sweeper composes a trial
            "+hydra.sweeper.params.batch_sizee='choice(32,64)'",
            "hydra.sweeper.params.batch_sizee is not allowed; no trial could set batch_sizee=32",
        ),
        ("hydra.sweeper.live_trials=kill", "hydra.sweeper.live_trials='kill' is not allowed"),
        ("hydra.sweeper.sampler=annealing", "hydra.sweeper.sampler='annealing' is not allowed"),
        ("hydra.sweeper.pruner=asha", "hydra.sweeper.pruner='asha' is not allowed"),
        ("optimizer.lr=interval(0.5, 0.1)", "needs low < high"),
        ("batch_size=glob(a*)", "batch_size=glob(a*) is not allowed"),
        ("hydra.sweeper.storage=afile/study.journal", "afile is a file, not a folder"),
        (  # more trials in flight than this machine has cores (or GPUs) for
            f"hydra.sweeper.n_jobs={len(os.sched_getaffinity(0)) + 1}",
            "is not allowed with hydra/launcher=processes on",
        ),
    ],
)
def test_bad_sweeper_settings_end_with_one_line_and_no_sweep_folder(tmp_path, override, message):
    (tmp_path / "afile").write_text("")
    done = train_in_process(
        "-m", *TINY, "hydra.sweep.dir=search", override, cwd=tmp_path, env=env(tmp_path)
    )
    check_one_line_and_no_sweep_folder(done, message, tmp_path)


def test_a_bad_sweeper_setting_ends_the_sweep_process_with_one_line_and_exit_2(tmp_path):
    """The process of the case above that the sweeper itself finds, composing a trial."""
    searched = "+hydra.sweeper.params.batch_sizee='choice(32,64)'"  # quoted: past the preflight
    done = sweep(tmp_path, "hydra.sweep.dir=search", searched)
    message = "hydra.sweeper.params.batch_sizee is not allowed; no trial could set batch_sizee=32"
    check_one_line_and_no_sweep_folder(done, message, tmp_path)


def check_one_line_and_no_sweep_folder(done, message: str, tmp_path) -> None:
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert not (tmp_path / "search").exists()


def readme_commands() -> list[list[str]]:
    """The commands of docs/optuna.md's first block, each as its words."""
    section = (ROOT / "docs" / "optuna.md").read_text()
    block = section.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    return [shlex.split(line.split("#", 1)[0]) for line in block.splitlines() if line.strip()]


def test_the_readme_commands_search_prune_and_report(tmp_path):
    _, search, report, _on_slurm = readme_commands()  # the last: tests/test_slurm.py
    assert search[:4] == ["python", "train.py", "-m", "hparams_search=lr_batch"]
    # the page's command, made tiny: later overrides win
    small = ("hydra.sweeper.n_trials=2", "max_steps=4", "val_every_n_steps=2")
    done = sweep_in_process(tmp_path, *search[4:], *small)
    assert done.returncode == 0, done.stderr
    sweep_dir = tmp_path / "multirun" / "lr"
    trials = load(sweep_dir).trials
    assert len(trials) == 2 and all(len(t.intermediate_values) >= 1 for t in trials)
    for t in trials:  # hparams_search=lr_batch's space, and the trial's values acted
        assert 0.001 <= t.params["optimizer.lr"] <= 0.5
        assert t.params["batch_size"] in (32, 64, 128, 256)
        assert summary(sweep_dir, t.number)["gears"]["batch_size"] == t.params["batch_size"]
    assert report[:2] == ["make", "report"] and report[2] == "DIR=multirun/lr"
    (sweep_dir / "study_report.md").unlink()
    made = make_report(tmp_path, sweep_dir)
    assert made.returncode == 0, made.stderr
    table = (sweep_dir / "study_report.md").read_text()
    assert "| 0 | " in table and "| 1 | " in table
    assert (sweep_dir / "optimization_history.png").stat().st_size > 0
    assert not (sweep_dir / "report.md").exists()  # not the gear report


def make_report(tmp_path, sweep_dir) -> subprocess.CompletedProcess:
    """`make report DIR=<sweep_dir>` from the repository, with this Python (a venv marked
    installed, so make installs nothing)."""
    venv = tmp_path / "venv"
    venv.mkdir(exist_ok=True)
    (venv / ".installed").touch()
    made = ["make", "--no-print-directory", "report", f"DIR={sweep_dir}"]
    return subprocess.run(
        [*made, f"VENV={venv}", f"PY={sys.executable}"],
        cwd=ROOT, env=env(tmp_path), capture_output=True, text=True, timeout=seconds(120),
    )  # fmt: skip


def test_the_report_finds_a_study_whose_journal_lives_elsewhere(tmp_path):
    # a sweep run with hydra.sweeper.storage=<path>: multirun.yaml names it
    journal = tmp_path / "studies" / "lr.journal"
    journal.parent.mkdir()
    storage = JournalStorage(JournalFileBackend(str(journal)))
    study = optuna.create_study(study_name="lr", storage=storage, direction="maximize")
    for value in (0.5, 0.7, 0.6):
        trial = study.ask({"optimizer.lr": optuna.distributions.FloatDistribution(1e-4, 1)})
        study.tell(trial, value)
    sweep_dir = tmp_path / "search"
    sweep_dir.mkdir()
    sweeper = {"_target_": "hydra_plugins.gearshift_sweeper.sweeper.OptunaSweeper"}
    multirun = {"hydra": {"sweeper": sweeper | {"storage": str(journal)}}}
    (sweep_dir / "multirun.yaml").write_text(json.dumps(multirun))  # JSON is YAML
    made = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "report.py"), "--no-plot", str(sweep_dir)],
        cwd=tmp_path, env=env(tmp_path), capture_output=True, text=True, timeout=seconds(60),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    report = (sweep_dir / "study_report.md").read_text()
    assert "# Study lr" in report and "Best: trial 1, value 0.7" in report
    assert [line[:6] for line in report.splitlines() if line.startswith("| ")][1:] == [
        "| 0 | ",
        "| 1 | ",
        "| 2 | ",
    ]


@pytest.mark.gpu
def test_on_a_machine_with_gpus_each_trial_in_flight_sees_one_gpu_of_its_own(tmp_path):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs: with one, a single trial runs at a time")
    sweep_dir = tmp_path / "search"
    done = sweep(
        tmp_path,
        "hydra.sweeper.n_trials=4",
        "hydra.sweeper.n_jobs=2",
        "batch_size=choice(32)",
        "max_steps=50",
        f"hydra.sweep.dir={sweep_dir}",
    )
    assert done.returncode == 0, done.stderr
    environments = {n: summary(sweep_dir, n)["environment"] for n in range(4)}
    ran = {n: run_span(sweep_dir / str(n)) for n in range(4)}
    for n, environment in environments.items():
        assert summary(sweep_dir, n)["device"].startswith("cuda")
        assert len(environment["cuda_visible_devices"].split(",")) == 1, environment
    for a in ran:
        for b in ran:
            if a < b and ran[a][0] < ran[b][1] and ran[b][0] < ran[a][1]:
                gpus = (
                    environments[a]["cuda_visible_devices"],
                    environments[b]["cuda_visible_devices"],
                )
                assert gpus[0] != gpus[1], (a, b, gpus)


def with_tests_on_the_path(tmp_path) -> dict[str, str]:
    """env() with tests/ on PYTHONPATH: train.py imports tests/injected.py's tasks."""
    path = os.pathsep.join([str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env(tmp_path) | {"PYTHONPATH": path}


def study_with_running_trials(tmp_path, n: int, name: str = "study") -> optuna.Study:
    """A study in <tmp_path>/study.journal whose trials 0..n-1 are running."""
    storage = open_storage(str(tmp_path / "study.journal"))
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    for _ in range(n):
        study.ask({"optimizer.lr": optuna.distributions.FloatDistribution(1e-4, 1)})
    return study


def test_a_run_that_fails_marks_its_trial_failed_with_its_error_line_at_once(tmp_path):
    study = study_with_running_trials(tmp_path, 1)
    done = train_in_process(
        "logger=none", "model=mlp", "progress_bar=false", "data.num_samples=64",
        "data.image_size=8", "batch_size=32", "max_steps=4", "warmup_steps=0",
        "task._target_=injected.NaNLossAt", "+task.at_step=2",
        "trial.reporter=hydra_plugins.gearshift_sweeper._study_reporter.OptunaReporter",
        f"trial.storage={tmp_path / 'study.journal'}", "trial.study=study", "trial.number=0",
        "hydra.run.dir=run", cwd=tmp_path, env=env(tmp_path),
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    [trial] = study.get_trials()  # no sweep told it: the run did, before it exited
    assert trial.state == TrialState.FAIL
    assert trial.user_attrs["failure"].startswith("non-finite loss (NaN or inf) at step 2;")
    assert f"error: {trial.user_attrs['failure']}" in done.stderr


class FakeJob:
    """A submitit local job as processes.job_result reads it: its process, its files."""

    def __init__(self, tmp_path, script: str) -> None:
        self._process = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
        self.printed = self._process.stderr.read().decode()
        self.paths = type("Paths", (), {"result_pickle": tmp_path / "absent.pkl"})

    def stderr(self) -> str:
        return self.printed

    def stdout(self) -> str:
        return ""


def test_a_job_that_exits_without_a_result_fails_with_its_last_error_line_or_its_status(
    tmp_path,
):
    from hydra_plugins.gearshift_launcher._processes import JobFailed, job_result

    said = "import sys; print('error: first', file=sys.stderr); "
    said += "print('error: loss is nan at step 4', file=sys.stderr); sys.exit(1)"
    with pytest.raises(JobFailed, match=r"^loss is nan at step 4$"):
        job_result(FakeJob(tmp_path, said))
    with pytest.raises(JobFailed, match=r"^exited with status 3 \(no error: line"):
        job_result(
            FakeJob(tmp_path, "import sys; print('Traceback', file=sys.stderr); sys.exit(3)")
        )
    with pytest.raises(JobFailed, match=r"^killed by SIGKILL$"):
        job_result(FakeJob(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"))


def failed_future(error: BaseException):
    future = Future()
    future.set_exception(error)
    return future


def test_the_sweeper_records_each_failure_keeps_a_runs_own_reason_and_ends_in_one_line(
    tmp_path, capsys
):
    from hydra_plugins.gearshift_launcher._processes import JobFailed
    from hydra_plugins.gearshift_sweeper._study_reporter import OptunaReporter

    study = study_with_running_trials(tmp_path, 2)
    made = sweeper(tmp_path)
    made.storage = study._storage
    OptunaReporter(str(tmp_path / "study.journal"), "study", 0).fail("non-finite loss at step 4")
    made.tell(study, 0, failed_future(JobFailed("exited with status 1")))  # the run's reason wins
    made.tell(study, 1, failed_future(RuntimeError("Traceback\nValueError: bad shape")))
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.FAIL]
    assert trials[0].user_attrs["failure"] == "non-finite loss at step 4"
    assert trials[1].user_attrs["failure"] == "RuntimeError: ValueError: bad shape"
    with pytest.raises(SystemExit) as ended:
        made.finish(study, tmp_path)
    assert ended.value.code == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "error: no trial of study 'study' completed; 2 of 2 failed, the first, trial 0: "
        "non-finite loss at step 4"
    ]
    report = (tmp_path / "study_report.md").read_text()
    assert "| failure |" in report.splitlines()[4]
    row = report.splitlines()[6]  # trial, state, lr, value, steps, pruned at, failure
    assert row.startswith("| 0 | fail | ") and row.endswith(
        "|  |  |  | non-finite loss at step 4 |"
    )


def test_a_live_trial_that_fails_while_the_rerun_waits_is_not_launched_again(tmp_path):
    from hydra_plugins.gearshift_sweeper._study_reporter import OptunaReporter

    study = study_with_running_trials(tmp_path, 1)
    holding = holding_process(tmp_path / "0")
    made = sweeper(tmp_path)
    made.storage = study._storage
    made.launcher = None  # it must launch nothing: the trial failed
    waiting = made.follow(tmp_path, study.get_trials()[0])
    OptunaReporter(str(tmp_path / "study.journal"), "study", 0).fail("out of memory at step 3")
    holding.kill()  # the run ends, failed, with no summary.json
    holding.wait()
    future = Future()
    try:
        future.set_result(waiting())
    except RuntimeError as error:
        future.set_exception(error)
    made.tell(study, 0, future)
    [trial] = study.get_trials()
    assert trial.state == TrialState.FAIL
    assert trial.user_attrs["failure"] == "out of memory at step 3"


def test_the_report_of_a_killed_sweep_shows_each_trial_as_it_ended(tmp_path):
    study = study_with_running_trials(tmp_path, 4)
    study.tell(0, 0.5)
    for number, stop_reason, value in ((1, "completed", 0.75), (2, "pruned", 0.25)):
        run = tmp_path / str(number)  # ended with its summary; the sweep was killed meanwhile
        run.mkdir()
        summary = {"steps": 8, "stop_reason": stop_reason, "best": {"value": value}}
        (run / "summary.json").write_text(json.dumps(summary))
    holding = holding_process(tmp_path / "3")  # still training
    try:
        report = write_report(study, tmp_path, plots=False).read_text()
    finally:
        holding.kill()
        holding.wait()
    rows = [line.split(" | ")[:2] for line in report.splitlines() if line.startswith("| ")][1:]
    assert rows == [["| 0", "complete"], ["| 1", "complete"], ["| 2", "pruned"], ["| 3", "running"]]
    assert "4 trials (1 running, 2 complete, 1 pruned)" in report
    assert "Best: trial 1, value 0.75" in report
    assert "| 1 | complete | " in report and "| 0.75 | 8 |" in report


def train_log(sweep_dir, number: int) -> str:
    log = sweep_dir / str(number) / "train.log"
    return log.read_text() if log.exists() else ""


def wait_for(condition, what: str, sweep: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + seconds(300)
    while not condition():
        assert sweep is None or sweep.poll() is None, f"the sweep ended before {what}"
        assert time.monotonic() < deadline, f"no {what}"
        time.sleep(0.02)


def test_a_sweep_killed_at_three_moments_trains_every_trial_once(tmp_path):
    """Trial 0 fails at step 2, trial 1 completes, trial 2 pauses at step 2 (injected.py's
    ScriptedTrial). The sweep is killed (SIGKILL) when trial 0 has failed, when trial 1 has
    written its summary, and while trial 2 trains; rerun each time. Slow tier (conftest.py):
    the sigkilled-sweep test above and the in-process tests of each moment's rule cover it."""
    sweep_dir = tmp_path / "search"
    overrides = (
        "hydra.sweeper.n_trials=3",
        "optimizer.lr=choice(0.05)",
        "batch_size=choice(32)",
        "max_steps=4",
        "checkpoint.every_n_steps=1",  # a step trained twice would save twice
        "task._target_=injected.ScriptedTrial",
        "+task.nan_at=0",
        "+task.pause_at=0",
        "task.nan_at=choice(0, 2)",
        "task.pause_at=choice(0, 2)",
        "hydra.sweeper.enqueue=[{task.nan_at: 2, task.pause_at: 0}, "
        "{task.nan_at: 0, task.pause_at: 0}, {task.nan_at: 0, task.pause_at: 2}]",
        f"hydra.sweep.dir={sweep_dir}",
    )

    def killed_when(condition, what: str) -> None:
        """A sweep run until `condition`, then SIGKILLed; returns once its trials ended."""
        sweep = subprocess.Popen(
            command(*overrides), cwd=tmp_path, env=with_tests_on_the_path(tmp_path),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            wait_for(condition, what, sweep)
            sweep.kill()  # the sweep alone: its trial notices, stops at its next step, saves
            sweep.wait()
            if (tmp_path / "paused").exists():
                (tmp_path / "go").touch()  # the paused trial goes on to that next step
            runs = list(sweep_dir.glob("[0-9]*"))
            wait_for(lambda: all(run_lock.holder(r) is None for r in runs), "end of the trials")
        finally:
            os.killpg(sweep.pid, signal.SIGKILL)  # nothing left behind should the test fail

    def report() -> str:  # _report's main, in this process (a process: scripts/report.py's)
        assert report_main(["--no-plot", str(sweep_dir)]) == 0
        return (sweep_dir / "study_report.md").read_text()

    killed_when(lambda: "error:" in train_log(sweep_dir, 0), "trial 0's failure")
    failed = load(sweep_dir).trials[0]  # marked by its run, or by the sweep before the kill
    assert failed.state == TrialState.FAIL
    assert failed.user_attrs["failure"].startswith("non-finite loss (NaN or inf) at step 2")
    killed_when(lambda: (sweep_dir / "1" / "summary.json").exists(), "trial 1's summary")
    assert "| 1 | complete |" in report()  # told by the sweep, or read from its summary
    killed_when(lambda: (tmp_path / "paused").exists(), "a paused trial")
    assert "| 2 | running |" in report()
    done = sweep_in_process(tmp_path, *overrides, environment=with_tests_on_the_path(tmp_path))
    assert done.returncode == 0, done.stderr

    trials = load(sweep_dir).trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    final = report()
    assert f"| {failed.user_attrs['failure']} |" in final  # the report names the failure
    for number, steps in ((0, [1]), (1, [1, 2, 3, 4]), (2, [1, 2, 3, 4])):
        log = train_log(sweep_dir, number)
        saved = [
            int(line.rsplit("step_", 1)[1])
            for line in log.splitlines()
            if " - checkpoint: " in line
        ]
        assert saved == steps, (number, saved)  # each step trained once, in order
    for number, end in ((0, "error: non-finite loss"), (1, "step_000000004")):
        log = train_log(sweep_dir, number)  # never launched again once it ended
        assert log.count(end) == 1 and " parameters, " not in log[log.index(end) :]
    assert "resumed from" in train_log(sweep_dir, 2)  # stopped by the kill, resumed once


def test_a_study_in_which_no_trial_completes_ends_with_one_line_and_exit_1(tmp_path):
    done = sweep_in_process(
        tmp_path,
        "hydra.sweeper.n_trials=1",
        "max_steps=3",
        "task._target_=injected.NaNLossAt",
        "+task.at_step=1",
        "hydra.sweep.dir=search",
        environment=with_tests_on_the_path(tmp_path),
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        "error: no trial of study 'lr_batch' completed; 1 of 1 failed, the first, trial 0: "
        "non-finite loss (NaN or inf) at step 1; stopped (on_nonfinite=stop), no checkpoint "
        "was saved before it; try a lower optimizer.lr, or on_nonfinite=skip to skip such "
        "steps' updates"
    ]
    assert "| fail |" in (tmp_path / "search" / "study_report.md").read_text()


# ---------------------------------------------------------------- the lr_batch preset


@pytest.mark.parametrize(
    ("overrides", "direction"),
    [((), "maximize"), (("experiment=regression",), "minimize")],
    ids=["classification-accuracy", "regression-loss"],
)
def test_the_optuna_preset_takes_the_tasks_direction(overrides, direction):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "config", overrides=["hparams_search=lr_batch", *overrides], return_hydra_config=True
        )
    assert OmegaConf.select(cfg, "hydra.sweeper.direction") == direction


@pytest.mark.slow  # covered fast: docs/optuna.md's lr_batch search, the best of test_optuna_sweeper
def test_optuna_search_over_lr_and_batch_size_maximises_the_val_accuracy(tmp_path):
    sweep_dir = tmp_path / "search"
    done = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "-m", *SWEEP_TINY, "logger=none",
         "hparams_search=lr_batch", "hydra.sweeper.n_trials=3", f"hydra.sweep.dir={sweep_dir}"],
        cwd=tmp_path, env=env(tmp_path), capture_output=True, text=True, timeout=seconds(300),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    trials = []
    for n in range(3):
        overrides = yaml.safe_load((sweep_dir / str(n) / ".hydra" / "overrides.yaml").read_text())
        chosen = dict(o.split("=", 1) for o in overrides if o.startswith(("optimizer.lr", "batch")))
        summary = json.loads((sweep_dir / str(n) / "summary.json").read_text())
        assert 0.001 <= float(chosen["optimizer.lr"]) <= 0.5
        assert int(chosen["batch_size"]) in (32, 64, 128, 256)
        assert summary["gears"]["batch_size"] == int(
            chosen["batch_size"]
        )  # the trial's value acted
        assert summary["best"]["metric"] == "val_accuracy"
        trials.append((summary["best"]["value"], chosen))
    assert len({t[1]["optimizer.lr"] for t in trials}) == 3  # the sampler proposed 3 points
    best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    best_value, best_choice = max(trials, key=lambda t: t[0])  # classification's mode: max
    assert best["best_value"] == pytest.approx(best_value)  # the objective: the best val metric
    assert best["best_params"]["batch_size"] == int(best_choice["batch_size"])
    assert best["best_params"]["optimizer.lr"] == pytest.approx(float(best_choice["optimizer.lr"]))
