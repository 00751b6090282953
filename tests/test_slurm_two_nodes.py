"""One job on two SLURM nodes (`hydra.launcher.nodes=2`), on the two-node cluster of
scripts/slurm/up.sh: two slurmd on this host, node1 and node2, whose names resolve nowhere
and whose NodeAddr is 127.0.0.1, so rank 0's address must come from `scontrol show node`.
Under CI the test fails, rather than skips, without such a cluster (as test_slurm.py's do).
"""

from __future__ import annotations

import json
import socket
import subprocess

import pytest
import torch
from helpers import seconds
from test_slurm import (  # noqa: F401  (slurm_cluster: the session's cluster fixture)
    Sweep,
    _unavailable,
    restarts,
    sacct_states,
    signal_when_checkpointed,
    slurm_cluster,
    start_requeued_job_now,
    wait_for,
)

from gearshift.state.checkpoint_folders import latest_checkpoint
from gearshift.state.checkpoint_reads import load_checkpoint

# one worker runs the SLURM tests, so they do not compete for the cluster's two nodes
pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm")]

STEPS, EVERY = 60, 10  # a checkpoint (and a log step, where both ranks agree to stop) every 10
# The command docs/distributed.md's SLURM section shows; distributed.timeout_s: ranks that cannot reach
# rank 0 fail the job within a minute instead of holding both nodes for five.
TWO_NODES = (
    "hydra.launcher.nodes=2",
    "hydra.launcher.tasks_per_node=1",
    "distributed.timeout_s=60",
)
TRAIN = (*TWO_NODES, f"max_steps={STEPS}", f"checkpoint.every_n_steps={EVERY}")


def ready_nodes() -> list[str]:
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, timeout=seconds(30)
    )
    rows = [line.split() for line in out.stdout.splitlines()]
    return sorted({name for name, state in rows if state in ("idle", "mix", "alloc")})


def resolves(name: str) -> bool:
    try:
        socket.getaddrinfo(name, None)
    except socket.gaierror:
        return False
    return True


@pytest.fixture
def two_sweeps(slurm_cluster, tmp_path):  # noqa: F811
    nodes = ready_nodes()
    if len(nodes) < 2:
        _unavailable(f"it has {len(nodes)} node(s) up ({nodes}); scripts/slurm/up.sh starts two")
    sweeps = [Sweep(tmp_path / "whole"), Sweep(tmp_path / "requeued")]
    for sweep in sweeps:
        sweep.folder.mkdir()
    yield sweeps
    for sweep in sweeps:
        sweep.cleanup()


def final_checkpoint(sweep: Sweep) -> dict:
    return load_checkpoint(latest_checkpoint(sweep.dir / "0" / "checkpoints"))


@pytest.mark.timeout(seconds(420))
def test_a_two_node_job_requeued_mid_run_ends_as_an_uninterrupted_one(two_sweeps):
    whole, requeued = two_sweeps
    first = ready_nodes()[0]
    assert not resolves(first), f"{first} resolves: the test would not catch a name as address"
    whole.start(*TRAIN, timeout_min=30)  # 30 min: submitit counts the USR2 as preemption
    requeued.start(*TRAIN, timeout_min=30)
    job = signal_when_checkpointed(requeued, "USR2", tasks=2, wait_s=240)
    start_requeued_job_now(requeued, job)
    for sweep in (whole, requeued):
        code, output = sweep.finish(timeout=300)
        assert code == 0, output[-3000:]
    assert restarts(job) == 1

    # the result comes back as soon as the task returns; the job itself ends a moment later
    array_id = job.split("_")[0]
    wait_for(lambda: sacct_states(array_id)[job] == "COMPLETED", 60, "the job to complete")
    nodelist = subprocess.run(
        ["squeue", "-h", "-j", job, "-t", "all", "-o", "%N"],
        capture_output=True,
        text=True,
        timeout=seconds(30),
    ).stdout.strip()
    hosts = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist],
        capture_output=True,
        text=True,
        timeout=seconds(30),
    ).stdout.split()
    assert len(hosts) == 2, nodelist  # one task on each node
    log = (requeued.dir / "0" / "train.log").read_text()  # both attempts write to it
    stopped_at = int(log.split("stopped by SIGUSR2 after step ")[1].split(";")[0])
    assert EVERY <= stopped_at < STEPS
    summary = json.loads((requeued.dir / "0" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == STEPS

    final, reference = final_checkpoint(requeued), final_checkpoint(whole)
    assert final["position"] == reference["position"]
    for name, tensor in reference["model"].items():
        assert torch.equal(final["model"][name], tensor), name
