"""Sweeps as SLURM jobs, on the real cluster of scripts/slurm/up.sh (one node is all they use).

The session fixture brings the cluster up (or uses it when it is up already). Where it
cannot (not root, no apt), these tests fail under CI and are skipped with the reason
elsewhere. Every test has a timeout and cancels its own jobs (each sweep has its own job
name), and a job that dies must fail the sweep, not hang it.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import helpers
import pytest
from helpers import ROOT, seconds

# one worker runs the SLURM tests, so they do not compete for the cluster's two nodes
pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm")]

SCRIPTS = ROOT / "scripts" / "slurm"
TINY = ("model=mlp", *helpers.TINY, "warmup_steps=1")


def _cluster_is_up() -> bool:
    """sinfo answers and a node can take jobs."""
    if shutil.which("sinfo") is None:
        return False
    out = subprocess.run(
        ["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=seconds(30)
    )
    return out.returncode == 0 and bool({"idle", "mix", "alloc"} & set(out.stdout.split()))


def _unavailable(why: str):
    message = f"the local SLURM cluster is not available: {why}"
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message + " (run `make slurm-up` as root)")


@pytest.fixture(scope="session")
def slurm_cluster():
    if _cluster_is_up():
        yield  # up already (make slurm-up): leave it up
        return
    if os.geteuid() != 0:
        _unavailable("scripts/slurm/up.sh needs root")
    up = subprocess.run(
        ["bash", str(SCRIPTS / "up.sh")], capture_output=True, text=True, timeout=seconds(600)
    )
    if up.returncode != 0:
        _unavailable(f"scripts/slurm/up.sh failed: {up.stderr.strip() or up.stdout.strip()}")
    yield
    subprocess.run(["bash", str(SCRIPTS / "down.sh")], capture_output=True, timeout=seconds(120))


class Sweep:
    """`python train.py -m hydra/launcher=slurm ...` in its own folder, under its own job name."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.dir = folder / "sweep"
        self.name = f"gearshift-test-{uuid.uuid4().hex[:8]}"
        self.process: subprocess.Popen | None = None

    def start(self, *overrides: str, timeout_min: int = 5) -> None:
        args = [
            sys.executable,
            str(ROOT / "train.py"),
            "-m",
            "hydra/launcher=slurm",
            f"hydra.launcher.name={self.name}",
            f"hydra.launcher.timeout_min={timeout_min}",
            "hydra.launcher.poll_s=2",  # a job that dies is noticed within 2 s
            f"hydra.sweep.dir={self.dir}",
            *TINY,
            *overrides,
        ]
        self.process = subprocess.Popen(
            args,
            cwd=self.folder,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def finish(self, timeout: float) -> tuple[int, str]:
        """The sweep's exit code and output, waiting at most `timeout` seconds (scaled)."""
        assert self.process is not None
        output, _ = self.process.communicate(timeout=seconds(timeout))  # expired: it hung
        return self.process.returncode, output

    def jobs(self) -> dict[str, str]:
        """{job id: state} of this sweep's jobs, array tasks one by one."""
        out = subprocess.run(
            ["squeue", "-h", "-r", "-t", "all", "-n", self.name, "-o", "%i %T"],
            capture_output=True,
            text=True,
            timeout=seconds(30),
            check=True,
        )
        return dict(line.split() for line in out.stdout.splitlines())

    def cleanup(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        subprocess.run(["scancel", "--name", self.name], capture_output=True, timeout=seconds(30))


@pytest.fixture
def sweep(slurm_cluster, tmp_path):
    s = Sweep(tmp_path)
    yield s
    s.cleanup()


def wait_for(condition, timeout: float, what: str, poll_s: float = 0.5) -> None:
    """Poll `condition` until it holds, for at most `timeout` seconds (scaled)."""
    deadline = time.monotonic() + seconds(timeout)
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll_s)


def sacct_states(job: str) -> dict[str, str]:
    """What `sacct` (the cluster's stand-in, as submitit calls it) says about a job's tasks."""
    out = subprocess.run(
        ["sacct", "-o", "JobID,State,NodeList", "--parsable2", "-j", job],
        capture_output=True,
        text=True,
        timeout=seconds(30),
        check=True,
    )
    header, *lines = out.stdout.splitlines()
    assert header == "JobID|State|NodeList"
    return {line.split("|")[0]: line.split("|")[1] for line in lines}


@pytest.mark.timeout(seconds(180))
def test_two_point_sweep_runs_as_two_slurm_jobs_and_returns_both_results(sweep):
    sweep.start("amp=off,bf16", "max_steps=4")
    code, output = sweep.finish(timeout=150)
    assert code == 0, output
    # results come back as soon as the task returns; the job itself ends a moment later
    wait_for(lambda: set(sweep.jobs().values()) == {"COMPLETED"}, 60, "both jobs to complete")
    jobs = sweep.jobs()
    assert len(jobs) == 2, jobs
    array_id = next(iter(jobs)).split("_")[0]
    assert sacct_states(array_id) == {f"{array_id}_0": "COMPLETED", f"{array_id}_1": "COMPLETED"}
    for point, amp in ((0, "off"), (1, "bfloat16")):
        summary = json.loads((sweep.dir / str(point) / "summary.json").read_text())
        assert summary["steps"] == 4 and summary["gears"]["amp"] == amp
        # what the launcher handed back to Hydra: the task's return value, from the job
        [result_file] = sweep.dir.glob(f".submitit/{array_id}_{point}/*_result.pkl")
        outcome, job_return = pickle.loads(result_file.read_bytes())
        assert outcome == "success"
        assert job_return.return_value == pytest.approx(summary["best"]["value"])
        assert f"amp={'off' if point == 0 else 'bf16'}" in job_return.overrides


@pytest.mark.timeout(seconds(180))
def test_a_job_that_raises_fails_the_sweep(sweep):
    # a 2-class head for 10-class labels: cross_entropy raises on the first batch
    sweep.start("model.num_classes=10,2", "max_steps=3")
    code, output = sweep.finish(timeout=150)
    assert code != 0
    assert "out of bounds" in output, output
    assert (sweep.dir / "0" / "summary.json").exists()  # the good point still ran
    assert not (sweep.dir / "1" / "summary.json").exists()


def training_pids(*environment: str) -> list[int]:
    """The training processes (every rank) of the SLURM job whose environment holds these."""
    wanted = {entry.encode() for entry in environment} | {b"SLURM_STEP_ID=0"}
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            environ = set((proc / "environ").read_bytes().split(b"\0"))
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        if wanted <= environ and b"submitit.core._submit" in argv and b"srun" not in argv[0]:
            pids.append(int(proc.name))
    assert pids, f"no training process with {environment}"
    return pids


def kill_training_process(job: str) -> None:
    """SIGKILL the job's training process, as the OOM killer would: it writes no result."""
    out = subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%A"], capture_output=True, text=True, timeout=seconds(30)
    )
    raw_id = out.stdout.strip()  # an array task's own SLURM_JOB_ID
    for pid in training_pids(f"SLURM_JOB_ID={raw_id}"):
        os.kill(pid, signal.SIGKILL)


def cancel(job: str) -> None:
    subprocess.run(["scancel", job], check=True, timeout=seconds(30))


@pytest.mark.timeout(seconds(240))
@pytest.mark.parametrize(
    ("end_job", "state"),
    [
        # the same launcher path as a cancel, each waiting out submitit's 15 s for a result
        pytest.param(kill_training_process, "FAILED", id="killed", marks=pytest.mark.slow),
        pytest.param(cancel, "CANCELLED", id="cancelled"),
    ],
)
def test_a_job_that_dies_without_a_result_fails_the_sweep(sweep, end_job, state):
    # point 0 finishes; point 1 trains until it is killed or cancelled
    sweep.start("max_steps=3,100000000")
    log = sweep.dir / "1" / "train.log"
    wait_for(lambda: log.exists() and "parameters" in log.read_text(), 120, "point 1 to train")
    [job] = [j for j, s in sweep.jobs().items() if j.endswith("_1") and s == "RUNNING"]
    end_job(job)
    code, output = sweep.finish(timeout=90)
    assert code != 0
    assert f"has not produced any output (state: {state})" in output, output
    assert sweep.jobs()[job] == state
    assert (sweep.dir / "0" / "summary.json").exists()


@pytest.mark.timeout(seconds(240))
def test_a_job_with_two_tasks_per_node_trains_as_2_rank_ddp(sweep):
    # each SLURM task runs the job; SLURM_PROCID/NTASKS/LOCALID make it a DDP rank
    sweep.start("hydra.launcher.tasks_per_node=2", "max_steps=6", "amp=off")
    code, output = sweep.finish(timeout=200)
    assert code == 0, output
    summary = json.loads((sweep.dir / "0" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["gears"]["distributed"] == "ddp"
    assert summary["samples"] == 6 * 2 * 16
    assert list(sweep.dir.glob("*/summary.json")) == [sweep.dir / "0" / "summary.json"]


def restarts(job: str) -> int:
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=seconds(30)
    )
    return int(out.stdout.split("Restarts=")[1].split()[0])


def pending(pid: int, signum: int) -> bool:
    """Whether `signum` waits, not yet handled, for process `pid` (which SIGSTOP holds)."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    masks = [int(line.split()[1], 16) for line in status if line.startswith(("SigPnd", "ShdPnd"))]
    return any(mask >> (signum - 1) & 1 for mask in masks)


def signal_when_checkpointed(
    sweep: Sweep, signum: str, tasks: int | None = None, wait_s: float = 120
) -> str:
    """Send the job `signum` (as SLURM does before the time limit or on preemption, with
    submitit's --signal=USR2) right after its first checkpoint. The training processes are
    held (SIGSTOP) from the moment the checkpoint shows until the signal waits for them,
    so on a machine of any speed the job stops a few steps after that checkpoint, and a
    short max_steps leaves the requeued job little to train."""
    checkpoints = sweep.dir / "0" / "checkpoints"
    wait_for(lambda: any(checkpoints.glob("step_*")), wait_s, "the first checkpoint", poll_s=0.01)
    pids = training_pids(f"SLURM_JOB_NAME={sweep.name}")
    assert tasks is None or len(pids) == tasks, pids  # one process per task, on any node
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        [job] = [j for j, s in sweep.jobs().items() if s == "RUNNING"]
        subprocess.run(["scancel", f"--signal={signum}", job], check=True, timeout=seconds(30))
        number = signal.Signals[f"SIG{signum}"]
        wait_for(lambda: all(pending(p, number) for p in pids), 30, f"{signum} to reach the job")
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    return job


def start_requeued_job_now(sweep: Sweep, job: str) -> None:
    """SLURM holds a requeued job back for a while (Reason=BeginTime, ~3 minutes here); wait
    until it is pending again, which shows the requeue happened, then let it start in 2 s.
    Not at once: the node revoked the job's credential at the requeue, to the second, and a
    start within that same second is refused ("Job credential revoked") and fails the job."""
    wait_for(lambda: sweep.jobs().get(job) == "PENDING", 60, "the job to be requeued")
    subprocess.run(
        ["scontrol", "update", f"JobId={job}", "StartTime=now+2"], check=True, timeout=seconds(30)
    )


# submitit counts a USR2 as reaching the time limit when the job has run past
# min(0.8 x limit, limit - 10 min) (always, for 5 minutes), else as preemption.
@pytest.mark.timeout(seconds(300))
@pytest.mark.parametrize(
    ("timeout_min", "ranks"),
    [(5, 1), (30, 1), (30, 2)],
    ids=["time-limit", "preemption", "preemption-2-rank-ddp"],
)
def test_a_signalled_job_checkpoints_is_requeued_and_resumes(sweep, timeout_min, ranks):
    # stopped a few steps after step 20 (DDP: at the next log step, every 10), whatever the
    # machine's speed; the requeued job trains the rest (a 2-rank gloo step is ~10x slower)
    steps, every = 200 // ranks, 20
    sweep.start(
        f"max_steps={steps}",
        f"checkpoint.every_n_steps={every}",
        f"hydra.launcher.tasks_per_node={ranks}",
        timeout_min=timeout_min,
    )
    job = signal_when_checkpointed(sweep, "USR2")
    start_requeued_job_now(sweep, job)
    code, output = sweep.finish(timeout=180)
    assert code == 0, output
    assert restarts(job) == 1
    log = (sweep.dir / "0" / "train.log").read_text()  # both attempts write to it
    stopped_at = int(log.split("stopped by SIGUSR2 after step ")[1].split(";")[0])
    assert every <= stopped_at < steps
    assert f"step_{stopped_at:09d} at step {stopped_at}" in log  # the requeued job resumed
    summary = json.loads((sweep.dir / "0" / "summary.json").read_text())
    assert summary["steps"] == steps and summary["samples"] == steps * 16 * ranks
    assert summary["world_size"] == ranks
    submitit_log = "".join(p.read_text() for p in sweep.dir.glob(".submitit/*/*_log.*"))
    case = "timed-out" if timeout_min == 5 else "preempted"
    assert f"this job is {case}" in submitit_log and "Requeued job" in submitit_log


@pytest.mark.timeout(seconds(240))
def test_a_job_at_its_time_limit_with_no_requeues_left_fails_the_sweep(sweep):
    sweep.start(
        "max_steps=4000", "checkpoint.every_n_steps=100", "hydra.launcher.max_num_timeout=0"
    )
    job = signal_when_checkpointed(sweep, "USR2")
    code, output = sweep.finish(timeout=180)
    assert code != 0
    assert "timed-out too many times" in output, output
    assert restarts(job) == 0
    assert any((sweep.dir / "0" / "checkpoints").glob("step_*"))  # saved for a manual resume
    assert not (sweep.dir / "0" / "summary.json").exists()
