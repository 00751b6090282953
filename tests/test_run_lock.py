"""A run folder has one writer: the lock on `<run dir>/.lock`, held for the run's life."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import ROOT, holding_process, seconds, train_in_process

from gearshift.state import run_lock
from gearshift.state.checkpoint_folders import latest_checkpoint


def test_a_second_holder_is_refused_with_the_pid_and_a_killed_holder_frees_the_folder(tmp_path):
    run_dir = tmp_path / "run"
    child = holding_process(run_dir)
    try:
        assert run_lock.holder(run_dir) == child.pid
        with pytest.raises(run_lock.RunFolderBusy, match=f"in use by process {child.pid}"):
            run_lock.hold(run_dir)
    finally:
        child.kill()  # SIGKILL: no cleanup of its own runs
        child.wait()
    assert run_lock.holder(run_dir) is None  # the kernel dropped the lock with the process
    run_lock.hold(run_dir)
    try:
        assert run_lock.holder(run_dir) == os.getpid()
    finally:
        run_lock.release(run_dir)
    assert run_lock.holder(run_dir) is None


def test_holder_writes_nothing_in_a_folder_without_a_lock(tmp_path):
    assert run_lock.holder(tmp_path / "absent") is None
    assert not (tmp_path / "absent").exists()
    assert run_lock.holder(tmp_path / "absent", wait=True) is None  # nothing to wait for


def arguments(run_dir, *overrides: str) -> list[str]:
    return [
        f"hydra.run.dir={run_dir}",
        "logger=none",
        "model=mlp",
        "progress_bar=false",
        "data.image_size=16",
        "checkpoint.every_n_steps=20",
        *overrides,
    ]


def train_in_background(run_dir, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *arguments(run_dir, *overrides)],
        cwd=run_dir.parent,
        env={**os.environ, "WANDB_MODE": "offline"},
        stdout=subprocess.DEVNULL,
    )


def train(run_dir, *overrides: str) -> subprocess.CompletedProcess:
    """In this process: the first run's process holds the lock, and this one meets it."""
    return train_in_process(
        *arguments(run_dir, *overrides), cwd=run_dir.parent, env={"WANDB_MODE": "offline"}
    )


def test_two_runs_in_one_folder_the_second_ends_with_one_line_and_a_killed_run_resumes(tmp_path):
    run_dir = tmp_path / "run"
    first = train_in_background(run_dir, "max_steps=1000000")
    try:
        deadline = time.monotonic() + seconds(300)
        while not list(run_dir.glob("checkpoints/step_*")):  # it is training
            assert first.poll() is None and time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.05)
        written = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()}
        log_size = (run_dir / "train.log").stat().st_size

        second = train(run_dir, "max_steps=10")
        assert second.returncode == 2, second.stderr
        lines = [line for line in second.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), lines
        assert f"in use by process {first.pid}" in lines[0], lines
        for path, mtime in written.items():  # the second wrote nothing: Hydra's files neither
            if path.name != "train.log" and "checkpoints" not in path.parts:
                assert path.stat().st_mtime_ns == mtime, path
        assert "in use by" not in (run_dir / "train.log").read_text()[:log_size]
        assert first.poll() is None  # the first trains on
    finally:
        os.kill(first.pid, signal.SIGKILL)  # no chance to clean up: the lock goes with it
        first.wait()

    saved = latest_checkpoint(run_dir / "checkpoints")
    step = int(saved.name.split("_")[-1])
    again = train(run_dir, "resume=auto", f"max_steps={step + 4}")
    assert again.returncode == 0, again.stderr
    assert f"resumed from {saved}" in (run_dir / "train.log").read_text()
