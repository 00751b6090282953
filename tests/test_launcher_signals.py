"""A stop signal to the local launcher's parent (`distributed.nproc_per_node=2`): the ranks
save, the parent says so in one line and exits 128+signal, and a rerun resumes exactly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from helpers import ROOT, run_train, seconds

from gearshift.state.checkpoint_folders import latest_checkpoint
from gearshift.state.checkpoint_reads import load_checkpoint

STEPS = 60  # far more than run between the first checkpoint and the ranks' SIGSTOP
TRAIN = [
    "distributed.nproc_per_node=2",
    "model=mlp",
    "data.image_size=8",
    "data.num_samples=256",
    "data.num_val_samples=0",
    "batch_size=16",
    f"max_steps={STEPS}",
    "checkpoint.every_n_steps=5",
    "log_every_n_steps=5",  # where the ranks agree to stop
    "logger=none",
    "progress_bar=false",
]


def train(run_dir: Path) -> subprocess.Popen:
    command = [sys.executable, str(ROOT / "train.py"), *TRAIN, f"hydra.run.dir={run_dir}"]
    return subprocess.Popen(
        command, cwd=run_dir.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def ranks_of(parent: int) -> list[int]:
    """The pids of the ranks the launcher started (multiprocessing's spawned children)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"spawn_main" in argv:
            found.append(int(pid))
    return found


def held(pid: int) -> bool:
    """Whether every thread of process `pid` has stopped (SIGSTOP takes effect a moment after
    it is sent; a signal that comes first would be handled, not left pending)."""
    tasks = Path(f"/proc/{pid}/task").iterdir()
    return all("\nState:\tT" in (task / "status").read_text() for task in tasks)


def pending(pid: int, signum: int) -> bool:
    """Whether `signum` waits, not yet handled, for process `pid` (which SIGSTOP holds)."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    masks = [int(line.split()[1], 16) for line in status if line.startswith(("SigPnd", "ShdPnd"))]
    return any(mask >> (signum - 1) & 1 for mask in masks)


def wait_for(condition, timeout: float, what: str, poll_s: float = 0.01) -> None:
    deadline = time.monotonic() + seconds(timeout)
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll_s)


def sigterm_after_first_checkpoint(parent: subprocess.Popen, run_dir: Path) -> None:
    """SIGTERM the launcher's parent once a checkpoint shows. The ranks are held (SIGSTOP)
    until the SIGTERM the parent passes on waits for both, so on a machine of any speed
    they stop a few steps after that checkpoint, far from the last step."""

    def checkpointed() -> bool:
        assert parent.poll() is None, parent.communicate()[0][-3000:]
        return (run_dir / "checkpoints").is_dir() and latest_checkpoint(
            run_dir / "checkpoints"
        ) is not None

    wait_for(checkpointed, 120, "the first checkpoint")
    ranks = ranks_of(parent.pid)
    assert len(ranks) == 2, ranks
    for pid in ranks:
        os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: all(held(p) for p in ranks), 30, "the ranks to stop")
        parent.send_signal(signal.SIGTERM)
        wait_for(lambda: all(pending(p, signal.SIGTERM) for p in ranks), 30, "SIGTERM at the ranks")
    finally:
        for pid in ranks:
            os.kill(pid, signal.SIGCONT)


def final_state(run_dir: Path) -> dict:
    return load_checkpoint(latest_checkpoint(run_dir / "checkpoints"))


def test_sigterm_to_the_launcher_saves_says_one_line_exits_143_and_a_rerun_resumes(tmp_path):
    stopped_dir = tmp_path / "stopped"
    processes = [train(tmp_path / "whole")]  # the uninterrupted run, alongside
    try:
        processes.append(train(stopped_dir))
        whole, stopped = processes
        sigterm_after_first_checkpoint(stopped, stopped_dir)
        output, _ = stopped.communicate(timeout=seconds(120))
        whole_output, _ = whole.communicate(timeout=seconds(240))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert whole.returncode == 0, whole_output[-3000:]

    assert stopped.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "Traceback" not in output and "death signal" not in output, output[-3000:]
    [line] = [line for line in output.splitlines() if "SIGTERM" in line]
    checkpoint = latest_checkpoint(stopped_dir / "checkpoints")
    step = load_checkpoint(checkpoint)["position"]["step"]
    assert 5 <= step < STEPS
    assert line == (
        f"stopped by SIGTERM after step {step}; checkpoint {checkpoint}; "
        f"to resume, run the same command with hydra.run.dir={stopped_dir}"
    )
    assert line in (stopped_dir / "train.log").read_text()
    assert not (stopped_dir / "summary.json").exists()

    resumed = run_train(*TRAIN, f"hydra.run.dir={stopped_dir}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final, reference = final_state(stopped_dir), final_state(tmp_path / "whole")
    assert final["position"] == reference["position"]
    for name, tensor in reference["model"].items():
        assert torch.equal(final["model"][name], tensor), name
