"""Two nodes for real: two torchrun agents on this machine, joined by c10d rendezvous.

Each node is its own agent (`--nnodes=2 --nproc_per_node=1`) with its own TMPDIR and its
own `data.stage_to` folder, as each node of a cluster has its own local disk; both work in
one folder, as nodes share a file system. The ranks run tests/node_train.py, which is
train.py plus what these tests read: each rank's final parameters and the staging copies.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers import ROOT, free_port, only_summary, seconds
from test_datasets import write_images

from gearshift.data.staging import staged_path
from gearshift.parallel.distributed import Ranks
from gearshift.parallel.process_group import agree_on_attempt
from gearshift.state.restore import changed_settings

RUN_ID = "two-nodes"
STEPS, CHECKPOINT_EVERY, DIE_AT = 12, 4, 6
TRAIN = [
    "model=mlp",
    "data=imagefolder",
    "data.num_classes=3",
    "data.num_samples=16",  # 2 ranks x batch 4: 2 steps an epoch
    "data.num_val_samples=null",
    "data.image_size=8",
    "batch_size=4",
    f"max_steps={STEPS}",
    f"checkpoint.every_n_steps={CHECKPOINT_EVERY}",
    "logger=none",
    "progress_bar=false",
]


@dataclass
class Node:
    folder: Path  # its TMPDIR, stage folder, copies.log and the agent's output
    agent: subprocess.Popen

    @property
    def stage_to(self) -> Path:
        return self.folder / "stage"

    @property
    def output(self) -> str:
        return (self.folder / "agent.log").read_text()

    def copies(self) -> list[str]:
        copies = self.folder / "copies.log"
        return copies.read_text().splitlines() if copies.exists() else []


def start_node(name: str, work: Path, images: Path, port: int, env: dict[str, str]) -> Node:
    folder = work / name
    (folder / "tmp").mkdir(parents=True)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint=127.0.0.1:{port}",
        f"--rdzv_id={RUN_ID}",
        "--max-restarts=1",
        str(ROOT / "tests" / "node_train.py"),
        *TRAIN,
        f"data.path={images}",
        f"data.stage_to={folder / 'stage'}",
    ]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(folder / "tmp"),
        "GEARSHIFT_TEST_OUT": str(work),
        "GEARSHIFT_TEST_COPIES": str(folder / "copies.log"),
        **env,
    }
    with open(folder / "agent.log", "w") as output:
        agent = subprocess.Popen(command, cwd=work, env=env, stdout=output, stderr=output)
    return Node(folder, agent)


def children(pid: int) -> list[int]:
    found = []
    for child in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{child}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(child))
    return found


def stop(agent: subprocess.Popen) -> None:
    """End an agent that is still running, and its ranks (they run in sessions of their own)."""
    if agent.poll() is not None:
        return
    ranks = children(agent.pid)
    agent.terminate()  # torchrun stops its ranks on SIGTERM
    try:
        agent.wait(timeout=seconds(30))
    except subprocess.TimeoutExpired:
        agent.kill()
        agent.wait()
    for pid in ranks:
        with contextlib.suppress(ProcessLookupError):  # gone with the agent
            os.kill(pid, signal.SIGKILL)


def run_two_nodes(work: Path, images: Path, die_on_b: bool = False) -> list[Node]:
    """Start nodes a and b, wait for both agents; with die_on_b, b's rank dies once at step
    DIE_AT (after the checkpoint of step CHECKPOINT_EVERY)."""
    work.mkdir()
    port = free_port()
    died = {"GEARSHIFT_TEST_DIE_AT": str(DIE_AT), "GEARSHIFT_TEST_DIED": str(work / "died")}
    nodes = [
        start_node("node_a", work, images, port, {}),
        start_node("node_b", work, images, port, died if die_on_b else {}),
    ]
    deadline = time.monotonic() + seconds(180)
    try:
        for node in nodes:
            node.agent.wait(timeout=max(0.0, deadline - time.monotonic()))
    finally:
        for node in nodes:
            stop(node.agent)
    for node in nodes:
        assert node.agent.returncode == 0, node.output[-3000:]
    return nodes


def rank_results(work: Path) -> list[dict]:
    return [torch.load(work / f"rank{r}.pt", weights_only=False) for r in range(2)]


def assert_staged_once_per_node(nodes: list[Node], images: Path) -> None:
    for node in nodes:
        staged = staged_path(images, node.stage_to)
        # one complete copy and its lock file, no temporary copy left behind
        assert sorted(p.name for p in node.stage_to.iterdir()) == [
            staged.name,
            f"{staged.name}.lock",
        ]
        assert sorted(p.name for p in staged.iterdir()) == ["c0", "c1", "c2"]
        [copy] = node.copies()  # copied once on this node, into its own folder
        assert copy.startswith(f"{images} -> {staged}.tmp-"), copy


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("data") / "images"
    write_images(folder, per_class=8)
    return folder


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory, images) -> tuple[Path, list[Node]]:
    work = tmp_path_factory.mktemp("whole") / "job"
    return work, run_two_nodes(work, images)


def test_two_nodes_train_one_job_in_one_run_folder(whole_run, images):
    work, nodes = whole_run
    assert [p.name for p in (work / "runs").iterdir()] == [f"torchrun_{RUN_ID}"]
    summary = only_summary(work)
    assert summary["world_size"] == 2 and summary["gears"]["distributed"] == "ddp"
    assert summary["steps"] == STEPS and summary["samples"] == STEPS * 2 * 4

    ranks = rank_results(work)
    assert [rank["optimizer_steps"] for rank in ranks] == [STEPS, STEPS]
    for name, tensor in ranks[0]["params"].items():
        assert torch.equal(tensor, ranks[1]["params"][name]), name
    assert_staged_once_per_node(nodes, images)


def test_a_rank_killed_on_one_node_restarts_both_which_resume_from_the_checkpoint(
    tmp_path, whole_run, images
):
    work = tmp_path / "job"
    nodes = run_two_nodes(work, images, die_on_b=True)
    assert (work / "died").read_text().endswith(f"died after step {DIE_AT}\n")
    assert "failed (exitcode: -9)" in nodes[1].output  # b's rank was killed ...
    summary = only_summary(work)  # ... and the job finished, in the same run folder
    assert summary["steps"] == STEPS and summary["samples"] == STEPS * 2 * 4

    train_log = (work / "runs" / f"torchrun_{RUN_ID}" / "train.log").read_text()
    assert train_log.count("resumed from") == 1  # one restart did it (both ranks agreed at once)
    assert f"resumed from {work / 'runs'}" in train_log
    assert f"step_{CHECKPOINT_EVERY:09d} at step {CHECKPOINT_EVERY}" in train_log
    for node in nodes:  # the node-local stage folders differ, and that is no change
        assert "other settings" not in node.output

    ranks = rank_results(work)
    whole = rank_results(whole_run[0])
    for rank in ranks:  # both nodes restarted, and trained only the steps after the checkpoint
        assert rank["optimizer_steps"] == STEPS - CHECKPOINT_EVERY
        for name, tensor in whole[0]["params"].items():  # where the whole run ended
            assert torch.equal(rank["params"][name], tensor), name
    assert_staged_once_per_node(nodes, images)  # the restart reused each node's copy


def test_ranks_agree_on_an_attempt_name_that_no_earlier_attempt_used():
    timeout = timedelta(seconds=seconds(30))
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    def agree(rank: int) -> str:
        store = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timeout)
        return agree_on_attempt(store, Ranks(rank=rank, world_size=2), timeout)

    with ThreadPoolExecutor(2) as pool:
        first = list(pool.map(agree, [0, 1]))
        assert first[0] == first[1]
        # The next attempt: rank 1 starts first and reads the first attempt's name ...
        old_nonce = server.get(f"gearshift/{first[0]}/nonce_1")
        late = pool.submit(agree, 1)
        deadline = time.monotonic() + timeout.total_seconds()
        while server.get(f"gearshift/{first[0]}/nonce_1") == old_nonce:
            assert time.monotonic() < deadline and not late.done()
            time.sleep(0.01)
        # ... and still ends up with this attempt's, once its rank 0 names it
        second = agree(0)
        assert late.result(timeout=timeout.total_seconds()) == second != first[0]


def test_node_local_stage_folders_are_no_change_of_settings():
    saved = {"data": {"stage_to": "/node_a/tmp", "path": "/data"}, "seed": 0}
    now = {"data": {"stage_to": "/node_b/tmp", "path": "/data"}, "seed": 1}
    assert changed_settings(saved, now) == ["seed=0 (now 1)"]
