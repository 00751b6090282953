"""DDP on CPU with gloo, 2 processes: equal parameters, no_sync, launchers, restarts, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import rank_failures
import torch
from distributed_workers import count_allreduces, train_recorded, train_sharded
from helpers import (
    CONF,
    ROOT,
    check_amp_on_resolved,
    free_port,
    make_cfg,
    on_ranks,
    only_summary,
    run_train,
    seconds,
)

import train
from gearshift.app import preflight
from gearshift.data.loading_base import epoch_order
from gearshift.engine.failures import TrainingFailed
from gearshift.local_ranks import FORWARDED_SIGNALS, launch_local
from gearshift.state.checkpoint_folders import latest_checkpoint
from gearshift.state.checkpoint_reads import load_checkpoint
from train import fit

TINY_CLI = [
    "data.image_size=8",
    "data.num_samples=256",
    "data.num_val_samples=32",
    "logger=none",
    "progress_bar=false",
]


def two_ranks(tmp_path: Path, overrides: list[str], worker=count_allreduces) -> list[dict]:
    return on_ranks(worker, 2, tmp_path, overrides)


def test_ddp_parameters_equal_on_every_rank_and_match_one_process_with_double_batch(tmp_path):
    common = ["model=mlp", "max_steps=6", "optimizer.schedule=constant", "optimizer.momentum=0"]
    ranks = two_ranks(tmp_path / "ddp", [*common, "batch_size=8"])
    for name, tensor in ranks[0]["params"].items():
        assert torch.equal(tensor, ranks[1]["params"][name]), name
    assert ranks[0]["summary"]["world_size"] == 2 and ranks[0]["summary"]["samples"] == 6 * 16

    single = fit(make_cfg(*common, "batch_size=16"), tmp_path / "single").model.state_dict()
    for name, tensor in single.items():
        # The same 16 samples per step, their gradient means summed in another order.
        torch.testing.assert_close(ranks[0]["params"][name], tensor, rtol=1e-5, atol=1e-6)


def test_fsdp_shards_train_to_the_same_parameters_as_one_process(tmp_path):
    common = ["model=mlp", "max_steps=4", "optimizer.schedule=constant", "optimizer.momentum=0"]
    ranks = two_ranks(tmp_path / "fsdp", [*common, "batch_size=8"], worker=train_sharded)
    assert ranks[0]["summary"]["gears"]["distributed"] == "fsdp"
    single = fit(make_cfg(*common, "batch_size=16"), tmp_path / "single").model.state_dict()
    for name, tensor in single.items():
        full = torch.cat([ranks[0]["shards"][name], ranks[1]["shards"][name]])  # dim-0 shards
        assert ranks[0]["shards"][name].numel() < tensor.numel()  # really sharded
        torch.testing.assert_close(full[: len(tensor)], tensor, rtol=1e-5, atol=1e-6)


def test_fsdp_checkpoints_resume_to_the_same_shards_as_an_uninterrupted_run(tmp_path):
    # momentum: the optimizer's sharded state must come back too
    common = ["model=mlp", "optimizer.schedule=constant", "batch_size=8"]
    whole = two_ranks(tmp_path / "whole", [*common, "max_steps=6"], worker=train_sharded)
    two_ranks(tmp_path / "parts", [*common, "max_steps=3"], worker=train_sharded)
    first = load_checkpoint(latest_checkpoint(tmp_path / "parts" / "rank0" / "checkpoints"))
    assert first["position"]["step"] == 3
    full, shard = first["model"]["1.weight"], whole[0]["shards"]["1.weight"]
    assert full.shape[0] == 2 * shard.shape[0]  # the whole tensor, gathered from both ranks
    # every rank writes its shards into the one run folder, rank 0's
    assert not (tmp_path / "parts" / "rank1" / "checkpoints").exists()
    step_3 = tmp_path / "parts" / "rank0" / "checkpoints" / "step_000000003"
    assert sorted(p.name for p in step_3.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    # the same folder again, 6 steps: resume=auto continues from step 3
    parts = two_ranks(tmp_path / "parts", [*common, "max_steps=6"], worker=train_sharded)
    assert parts[0]["summary"]["steps"] == 6
    # steps 4-6, not 1-6 (set_optimizer_state_dict may take one zero-gradient step to
    # create the optimizer's state before loading it)
    assert all(rank["optimizer_steps"] in (3, 4) for rank in parts)
    for rank in (0, 1):
        for name, shard in whole[rank]["shards"].items():
            assert torch.equal(parts[rank]["shards"][name], shard), (rank, name)


# The tiny GPT at its smallest (2 blocks of width 32 over 16-token windows), trained by plain
# SGD with a clipping threshold that binds, so every rank's update depends on the global norm.
GPT_CLIPPED = [
    "logger=none",
    "progress_bar=false",
    "task=lm",
    "data=synthetic_tokens",
    "data.vocab_size=32",
    "data.block_size=16",
    "data.num_samples=128",
    "data.num_val_samples=16",
    "model=gpt",
    "model.n_layer=2",
    "model.n_head=2",
    "model.n_embd=32",
    "max_steps=4",
    "log_every_n_steps=1",
    "optimizer.lr=0.5",
    "optimizer.momentum=0",
    "optimizer.schedule=constant",
    "optimizer.clip_grad_norm=0.1",
]


@pytest.fixture(scope="module")
def gpt_one_process(tmp_path_factory):
    """One process, batch 16: the parameters and logged gradient norms 2 ranks must reach.
    Run here (a spawned process costs seconds), undoing what the worker sets for a rank."""
    run_dir = tmp_path_factory.mktemp("gpt_one_process")
    environ, threads = dict(os.environ), torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:  # the worker's recording logger too
        patch.setattr(train, "build_logger", train.build_logger)
        try:  # in this process: the rank's RANK=0, WORLD_SIZE=1 and one thread must not outlive it
            train_recorded(0, 1, free_port(), str(run_dir), [*GPT_CLIPPED, "batch_size=16"])
        finally:  # (a later train.py run would inherit RANK and skip nproc_per_node's launcher)
            os.environ.clear()
            os.environ.update(environ)
            torch.set_num_threads(threads)
    return torch.load(run_dir / "rank0.pt", weights_only=False)


def grad_norms(recorded: dict) -> list[float]:
    return [m["train/grad_norm"] for m in recorded["logged"] if "train/grad_norm" in m]


@pytest.mark.parametrize(
    "gears",
    [["distributed=ddp"], ["distributed=fsdp", "model.checkpointing=true"]],
    ids=["ddp", "fsdp-per-block-checkpointed"],
)
def test_2_ranks_on_the_gpt_with_clipping_reach_one_process_parameters(
    tmp_path, gpt_one_process, gears
):
    ranks = two_ranks(tmp_path, [*GPT_CLIPPED, *gears, "batch_size=8"], worker=train_recorded)
    one = gpt_one_process
    norms = grad_norms(one)
    assert len(norms) == 4 and min(norms) > 0.1  # every step clipped
    for rank in ranks:
        # The norm each rank clips with and logs is the global one: under FSDP a shard's own
        # norm would be about 1/sqrt(2) of it.
        assert grad_norms(rank) == pytest.approx(norms, rel=1e-4)
    if gears[0] == "distributed=fsdp":
        # sharded block by block, then the root: the root unit holds only the embeddings,
        # the final norm and the tied head
        assert ranks[0]["units"] == ["", "blocks.0", "blocks.1"]
    for name, tensor in one["params"].items():
        if gears[0] == "distributed=fsdp":  # each rank holds dim-0 shards
            whole = torch.cat([ranks[0]["params"][name], ranks[1]["params"][name]])
            assert ranks[0]["params"][name].numel() < tensor.numel(), name  # really sharded
        else:
            assert torch.equal(ranks[0]["params"][name], ranks[1]["params"][name]), name
            whole = ranks[0]["params"][name]
        # the same 16 windows a step, their gradient means summed in another order
        torch.testing.assert_close(whole[: len(tensor)], tensor, rtol=1e-4, atol=1e-6)


def test_accumulation_all_reduces_once_per_optimizer_step(tmp_path):
    ranks = two_ranks(tmp_path, ["model=mlp", "accum=4", "data.num_samples=320", "epochs=1"])
    for rank in ranks:
        # 320 samples / 2 ranks / batch 16 = 10 micro-batches: windows of 4, 4, 2 -> 3 steps
        assert rank["steps"] == 3
        assert rank["allreduces"] == rank["steps"] * rank["buckets"]  # none on no_sync steps


def test_uneven_dataset_shards_equally_and_covers_every_sample():
    shares = [
        epoch_order(37, epoch=3, seed=0, shuffle=True, rank=r, world_size=2) for r in range(2)
    ]
    assert len(shares[0]) == len(shares[1]) == 19  # padded by wrapping around
    assert set(torch.cat(shares).tolist()) == set(range(37))


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args, str(ROOT / "train.py")]


def test_torchrun_leaves_one_run_folder_with_world_size_2(tmp_path):
    command = [
        *torchrun("--standalone", "--nproc_per_node=2"),
        "model=mlp",
        *TINY_CLI,
        "max_steps=20",
    ]
    result = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=seconds(300)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = only_summary(tmp_path)
    assert summary["world_size"] == 2 and summary["gears"]["distributed"] == "ddp"
    assert summary["samples"] == 20 * 2 * 64


def left_in(temporary: Path) -> list[str]:
    """What a run left in its system temporary folder (TMPDIR), but for torch's compile
    cache, which every run, one process too, keeps there for the next."""
    return sorted(p.name for p in temporary.iterdir() if not p.name.startswith("torchinductor_"))


def test_nproc_per_node_starts_the_ranks_itself(tmp_path):
    temporary = tmp_path / "tmp"  # the run's system temporary folder
    temporary.mkdir()
    result = run_train(
        "distributed.nproc_per_node=2", "model=mlp", *TINY_CLI, "max_steps=20",
        cwd=tmp_path, env={"TMPDIR": str(temporary)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = only_summary(tmp_path)
    assert summary["world_size"] == 2 and summary["steps"] == 20
    assert left_in(temporary) == []  # once a torchelastic_* folder per run


def with_tests_on_the_path() -> str:
    """PYTHONPATH with tests/ on it, for train.py to import tests/injected.py."""
    return os.pathsep.join([str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])])


def test_ranks_that_fail_leave_nothing_in_the_temporary_folder(tmp_path):
    # a failed rank's pytorch-errorfile-*.pickle stayed, besides the torchelastic_* folder
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    result = run_train(
        "distributed.nproc_per_node=2", "model=mlp", *TINY_CLI, "max_steps=4",
        "task._target_=injected.NaNLossAt", "+task.at_step=1",
        cwd=tmp_path, env={"TMPDIR": str(temporary), "PYTHONPATH": with_tests_on_the_path()},
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if "non-finite loss" in line]
    assert line.startswith("error: ") and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert left_in(temporary) == []


def test_ranks_that_raise_leave_nothing_in_the_temporary_folder(tmp_path, monkeypatch):
    # The launcher in this process and its ranks spawned with a `fit` that fails as training
    # does (the train.py process of it is slow; test_input_..._from_rank_0[task-nproc_per_
    # node] runs the launcher from train.py, its temporary folder left clean too).
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))  # this process's temporary folder
    environ = dict(os.environ)  # torch elastic's agent sets variables and signal handlers here
    handlers = {name: signal.getsignal(signal.Signals[name]) for name in FORWARDED_SIGNALS}
    cfg = make_cfg("distributed.nproc_per_node=2", "model=mlp")
    try:
        os.environ["TMPDIR"] = str(temporary)  # the ranks'
        with pytest.raises(TrainingFailed) as failed:  # rank 0's line, not elastic's report
            launch_local(rank_failures.fails_in_training, cfg, tmp_path, None)
    finally:
        os.environ.clear()
        os.environ.update(environ)
        for name, handler in handlers.items():
            signal.signal(signal.Signals[name], handler)
    assert str(failed.value) == "non-finite loss (NaN or inf) on rank 0"
    # a failed rank's pytorch-errorfile-*.pickle stayed, besides the torchelastic_* folder
    assert left_in(temporary) == []


def one_class_image_folder(folder: Path) -> Path:
    """An image folder with 1 class folder: data.num_classes=10 (the default) is unusable,
    found by the ranks as they build the data."""
    from PIL import Image

    (folder / "a").mkdir(parents=True)
    for i in range(3):
        Image.new("RGB", (8, 8)).save(folder / "a" / f"{i}.png")
    return folder


# Unusable input that only the ranks find (as they build), not the check before launching.
FOUND_BY_THE_RANKS = {
    "data": (
        lambda tmp: ["data=imagefolder", f"data.path={one_class_image_folder(tmp / 'images')}"],
        "error: data.num_classes=10 is not allowed; {tmp}/images has 1 class folders (a); "
        "set data.num_classes=1",
    ),
    "task": (
        lambda tmp: ["task._target_=torch.nn.Identity"],
        "error: task._target_='torch.nn.Identity' is not allowed; it built a Identity, "
        "expected a subclass of gearshift.tasks.Task",
    ),
}


@pytest.mark.parametrize("launcher", ["nproc_per_node", "torchrun", "gearshift.torchrun"])
@pytest.mark.parametrize("found_in", FOUND_BY_THE_RANKS)
def test_input_the_ranks_find_unusable_is_one_line_from_rank_0(tmp_path, launcher, found_in):
    overrides, message = FOUND_BY_THE_RANKS[found_in]
    work = tmp_path / "work"  # where runs/ would go
    work.mkdir()
    train = ["model=mlp", *TINY_CLI, "max_steps=2", *overrides(tmp_path)]
    if launcher == "gearshift.torchrun":  # torchrun's arguments, our one line and exit 2
        command = [sys.executable, "-m", "gearshift.torchrun", "--standalone", "--nproc_per_node=2"]
        result = subprocess.run(
            [*command, str(ROOT / "train.py"), *train],
            cwd=work, capture_output=True, text=True, timeout=seconds(300),
        )  # fmt: skip
        assert result.returncode == 2
        # the last line, after torchrun's notice at the start (OMP_NUM_THREADS=1 per rank)
        assert result.stderr.strip().splitlines()[-1] == message.format(tmp=tmp_path)
        assert "ChildFailedError" not in result.stderr and "exitcode" not in result.stderr
    elif launcher == "torchrun":
        command = [*torchrun("--standalone", "--nproc_per_node=2"), *train]
        result = subprocess.run(
            command, cwd=work, capture_output=True, text=True, timeout=seconds(300)
        )
        # torchrun's agent, its own process, ends with its ChildFailedError report (exit 1);
        # the ranks it shows exited 2 and printed nothing but rank 0's line
        assert result.returncode == 1 and "exitcode  : 2" in result.stderr
    else:
        temporary = tmp_path / "tmp"  # the run's system temporary folder
        temporary.mkdir()
        env = {"TMPDIR": str(temporary)}
        result = run_train("distributed.nproc_per_node=2", *train, cwd=work, env=env)
        assert result.returncode == 2
        assert result.stderr.strip() == message.format(tmp=tmp_path)
        assert left_in(temporary) == []  # torch elastic's torchelastic_* folder too
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [message.format(tmp=tmp_path)], result.stderr[-3000:]
    assert "Traceback" not in result.stderr.split("failed (exitcode")[0]  # none from the ranks
    assert list(work.iterdir()) == []  # no run folder


def test_a_multirun_sweep_runs_each_job_as_2_rank_ddp(tmp_path):
    result = run_train(
        "-m",
        "distributed.nproc_per_node=2",
        "amp=off,on",
        "model=mlp",
        *TINY_CLI,
        "max_steps=10",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summaries = [json.loads(p.read_text()) for p in tmp_path.glob("multirun/*/*/summary.json")]
    amp_off = [s["gears"]["amp_reason"] == "float32: amp=off" for s in summaries]
    assert sorted(amp_off) == [False, True]
    check_amp_on_resolved(summaries[amp_off.index(False)]["gears"])  # amp=on
    assert all(s["world_size"] == 2 for s in summaries)


def worker_pids(agent: subprocess.Popen) -> dict[int, int]:
    """{rank: pid} of the training processes under a torchrun agent (read from /proc)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        rank = next((e[5:] for e in environ if e.startswith(b"RANK=")), None)
        if parent == agent.pid and rank is not None:
            found[int(rank)] = int(pid)
    return found


def test_a_killed_rank_restarts_the_job_which_resumes_to_the_same_parameters(tmp_path):
    # simple_cnn: slow enough per step that the kill lands mid-run, BatchNorm buffers included
    train = ["model=simple_cnn", *TINY_CLI, "data.image_size=16", "max_steps=40"]
    train += ["checkpoint.every_n_steps=5", "resume=auto"]
    whole = tmp_path / "whole"  # the uninterrupted run, its 2 ranks forked from this process
    two_ranks(whole, train, worker=train_recorded)

    killed = tmp_path / "killed"
    killed.mkdir()
    agent = subprocess.Popen(
        [*torchrun("--standalone", "--nproc_per_node=2", "--max-restarts=1"), *train],
        cwd=killed,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + seconds(240)
    while not list(killed.glob("runs/*/checkpoints/step_*")):
        assert agent.poll() is None and time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    os.kill(worker_pids(agent)[1], signal.SIGKILL)
    _, stderr = agent.communicate(timeout=seconds(300))
    assert b"failed (exitcode: -9)" in stderr  # rank 1 died ...
    assert agent.returncode == 0, stderr[-3000:]  # ... and the restarted job finished

    [final_dir] = killed.glob("runs/*/checkpoints")
    final = load_checkpoint(latest_checkpoint(final_dir))
    reference = load_checkpoint(latest_checkpoint(whole / "rank0" / "checkpoints"))
    assert final["position"] == reference["position"]
    for name, tensor in reference["model"].items():
        assert torch.equal(final["model"][name], tensor), name


def test_a_failed_rank_ends_the_job_instead_of_hanging(tmp_path):
    agent = subprocess.Popen(
        [
            *torchrun("--standalone", "--nproc_per_node=2"),
            "model=mlp",
            *TINY_CLI,
            "max_steps=100000",
            "checkpoint.every_n_steps=2",  # a checkpoint: the ranks are in the training loop
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + seconds(240)
    while len(worker_pids(agent)) < 2 or not list(tmp_path.glob("runs/*")):
        assert agent.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    while not list(tmp_path.glob("runs/*/checkpoints/step_*")):  # they are in the loop
        assert agent.poll() is None and time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    os.kill(worker_pids(agent)[1], signal.SIGKILL)
    assert agent.wait(timeout=seconds(120)) != 0  # the agent tears it down well inside that


BAD_DISTRIBUTED_INPUT = [
    (
        "distributed=ddp",
        "error: distributed='ddp' is not allowed; it needs several processes: launch it with "
        "torchrun --nproc_per_node=N train.py ... or add distributed.nproc_per_node=N",
    ),
    *(  # with CUDA devices DataParallel is allowed: test_gpu.py trains with it
        []
        if torch.cuda.is_available()
        else [
            (
                "distributed=dp",
                "error: distributed='dp' is not allowed; DataParallel needs CUDA devices; "
                "use distributed=ddp on CPU",
            )
        ]
    ),
    (
        "distributed.nproc_per_node=0",
        "error: distributed.nproc_per_node=0 is not allowed; expected an integer >= 1",
    ),
]


@pytest.mark.parametrize(("override", "message"), BAD_DISTRIBUTED_INPUT)
def test_bad_distributed_input_is_one_line_before_any_run_folder(
    tmp_path, monkeypatch, capsys, override, message
):
    monkeypatch.chdir(tmp_path)  # what train.py runs first, in this process
    with pytest.raises(SystemExit) as exit:
        preflight(CONF, argv=[override])
    assert exit.value.code == 2
    assert capsys.readouterr().err.strip() == message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("override", "message"), BAD_DISTRIBUTED_INPUT)
def test_bad_distributed_input_is_one_line(tmp_path, override, message):
    result = run_train(override, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == message
    assert list(tmp_path.iterdir()) == []
