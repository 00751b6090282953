"""Checkpoints: atomic saves, exact resume (in-process and after a real SIGTERM), clear errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers import ROOT, make_cfg, run_train, seconds
from torch.optim.optimizer import register_optimizer_step_post_hook

from gearshift.state.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from gearshift.state.preemption import TrainingStopped
from gearshift.trainer import fit


def assert_same_parameters(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


class SignalAtStep:
    """Sends this process `signum` right after optimizer step `step` (a scheduler's warning)."""

    def __init__(self, step: int, signum: int = signal.SIGTERM) -> None:
        self.step, self.signum, self.count = step, signum, 0

    def __enter__(self):
        def hook(optimizer, args, kwargs):
            self.count += 1
            if self.count == self.step:
                os.kill(os.getpid(), self.signum)

        self.handle = register_optimizer_step_post_hook(hook)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


@pytest.mark.parametrize(
    ("source", "signum"),
    [
        (("data.on_device=true",), signal.SIGTERM),
        (("data.on_device=true",), signal.SIGUSR1),
        (("data.on_device=false", "dataloader.num_workers=0"), signal.SIGTERM),
    ],
    ids=["device-batches-TERM", "device-batches-USR1", "dataloader-TERM"],
)
def test_stop_mid_epoch_then_resume_equals_an_uninterrupted_run(tmp_path, source, signum):
    # 256 samples / batch 16 = 16 batches = 8 steps an epoch with accum 2; stop in epoch 1.
    # amp=on: autocast where it is fast here, never an emulated dtype's cost (100x on some CPUs)
    gears = ("model=simple_cnn", "accum=2", "max_steps=20", "amp=on", *source)
    whole = fit(make_cfg(*gears), tmp_path / "whole")

    run_dir = tmp_path / "stopped"
    with SignalAtStep(11, signum), pytest.raises(TrainingStopped) as stopped:
        fit(make_cfg(*gears), run_dir)
    assert stopped.value.step == 11 and stopped.value.signum == signum
    saved = load_checkpoint(latest_checkpoint(run_dir / "checkpoints"))
    # 6 batches of epoch 1 taken: its data position is 6 x 16 samples
    assert saved["position"] == {
        "step": 11, "epoch": 1, "epoch_samples": 6 * 16, "samples": 11 * 32, "global_batch": 16
    }  # fmt: skip
    assert not (run_dir / "summary.json").exists()  # no summary for an unfinished run

    resumed = fit(make_cfg(*gears, "resume=auto"), run_dir)
    assert_same_parameters(resumed.model, whole.model)
    assert resumed.summary["steps"] == 20 and resumed.summary["samples"] == whole.summary["samples"]


def test_the_gpt_stopped_mid_epoch_then_resumed_equals_an_uninterrupted_run(tmp_path):
    # The tiny GPT at its smallest on token windows served by the DataLoader; 128 windows /
    # batch 16 = 8 batches = 4 steps an epoch with accum 2: SIGTERM after step 6, in epoch 1.
    # AdamW (its moments must come back) with clipping (the norm is taken every step).
    gears = (
        *("logger=none", "progress_bar=false", "task=lm", "data=synthetic_tokens"),
        *("data.vocab_size=32", "data.block_size=16", "data.num_samples=128"),
        *("data.num_val_samples=16", "data.on_device=false", "dataloader.num_workers=0"),
        *("model=gpt", "model.n_layer=2", "model.n_head=2", "model.n_embd=32"),
        *("optimizer=adamw", "optimizer.clip_grad_norm=0.5", "batch_size=16", "accum=2"),
        "max_steps=10",
    )
    whole = fit(make_cfg(*gears, tiny=False), tmp_path / "whole")

    run_dir = tmp_path / "stopped"
    with SignalAtStep(6), pytest.raises(TrainingStopped) as stopped:
        fit(make_cfg(*gears, tiny=False), run_dir)
    assert stopped.value.step == 6
    saved = load_checkpoint(latest_checkpoint(run_dir / "checkpoints"))
    assert saved["position"] == {
        "step": 6, "epoch": 1, "epoch_samples": 4 * 16, "samples": 6 * 32, "global_batch": 16
    }  # fmt: skip

    resumed = fit(make_cfg(*gears, "resume=auto", tiny=False), run_dir)
    assert_same_parameters(resumed.model, whole.model)
    assert resumed.summary["steps"] == 10 and resumed.summary["samples"] == 10 * 32


def test_checkpoint_every_n_steps_keeps_the_newest(tmp_path):
    fit(
        make_cfg("model=mlp", "max_steps=10", "checkpoint.every_n_steps=3", "checkpoint.keep=2"),
        tmp_path,
    )
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    # 3, 6 dropped; 10 = the end; best.pt (the one validation, at the end) is no step checkpoint
    assert names == ["best.pt", "step_000000009.pt", "step_000000010.pt"]


def test_resume_auto_without_checkpoints_starts_fresh(tmp_path):
    assert fit(make_cfg("model=mlp", "max_steps=2", "resume=auto"), tmp_path).summary["steps"] == 2


CRASHING_SAVE = """
import os, signal, sys, torch
from pathlib import Path
from gearshift.state import checkpoint
folder = Path(sys.argv[1])
checkpoint.save_checkpoint({"w": torch.ones(3)}, folder, step=1, keep=5)
if sys.argv[2] == "before-rename":
    os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
else:  # mid-write: half a file, then the process dies
    def torn_save(obj, file):
        file.write(b"PK\\x03\\x04" + b"\\0" * 1000)
        file.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    checkpoint.torch.save = torn_save
checkpoint.save_checkpoint({"w": torch.zeros(3)}, folder, step=2, keep=5)
"""


@pytest.mark.parametrize("moment", ["mid-write", "before-rename"])
def test_a_crash_during_a_save_leaves_the_previous_checkpoint_loadable(tmp_path, moment):
    crash = subprocess.run(
        [sys.executable, "-c", CRASHING_SAVE, str(tmp_path), moment], timeout=seconds(60)
    )
    assert crash.returncode == -signal.SIGKILL
    assert any(p.name.endswith(".tmp") for p in tmp_path.iterdir())  # the torn file is there
    newest = latest_checkpoint(tmp_path)
    assert newest.name == "step_000000001.pt"
    assert torch.equal(load_checkpoint(newest)["w"], torch.ones(3))
    save_checkpoint({"w": torch.full((3,), 3.0)}, tmp_path, step=3, keep=5)
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())  # cleaned up


# Three runs of train.py. The fast suite covers it in parts: an exact resume after a signal
# (test_stop_mid_epoch_...), and a real signal to train.py, then a rerun that resumes
# (test_a_stop_signal_is_handed_on_...).
@pytest.mark.slow
def test_sigterm_to_a_real_run_then_resume_auto_matches_an_uninterrupted_run(tmp_path):
    common = [
        "model=simple_cnn",
        "data.num_samples=512",
        "data.num_val_samples=64",
        "data.image_size=16",
        "batch_size=32",
        "max_steps=60",
        "logger=none",
        "progress_bar=false",
    ]
    whole = run_train(*common, f"hydra.run.dir={tmp_path / 'whole'}", cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr[-2000:]

    run_dir = tmp_path / "stopped"
    command = [sys.executable, str(ROOT / "train.py"), *common]
    command += [f"hydra.run.dir={run_dir}", "checkpoint.every_n_steps=5"]
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + seconds(120)
    while (
        latest_checkpoint(run_dir / "checkpoints") is None
        if (run_dir / "checkpoints").exists()
        else True
    ):
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=seconds(120))
    assert process.returncode == 128 + signal.SIGTERM, output[-2000:]
    assert "stopped by SIGTERM" in (run_dir / "train.log").read_text()
    stopped_at = load_checkpoint(latest_checkpoint(run_dir / "checkpoints"))["position"]["step"]
    assert 5 <= stopped_at < 60

    resumed = run_train(*common, f"hydra.run.dir={run_dir}", cwd=tmp_path)  # resume=auto
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    final = load_checkpoint(latest_checkpoint(run_dir / "checkpoints"))
    reference = load_checkpoint(latest_checkpoint(tmp_path / "whole" / "checkpoints"))
    assert final["position"] == reference["position"]
    for name, tensor in reference["model"].items():
        assert torch.equal(final["model"][name], tensor), name


# Like submitit in a SLURM job: a Python handler for SIGUSR2 that requeues the job and exits.
# The run must save its checkpoint first, then hand the signal on.
UNDER_A_REQUEUEING_HANDLER = """
import os, signal, sys
from pathlib import Path
from torch.optim.optimizer import register_optimizer_step_post_hook
run_dir = Path(sys.argv[1])
def requeue(signum, frame):
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("*.pt"))
    (run_dir / "handed_over").write_text(f"{signal.Signals(signum).name} {saved}")
    sys.exit(-1)
signal.signal(signal.SIGUSR2, requeue)
steps = []
def hook(optimizer, args, kwargs):
    steps.append(1)
    if len(steps) == 7:
        os.kill(os.getpid(), signal.SIGUSR2)
register_optimizer_step_post_hook(hook)
sys.argv = ["train.py", *sys.argv[2:]]
import runpy
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_stop_signal_is_handed_on_after_the_checkpoint_and_a_rerun_resumes(tmp_path):
    run_dir = tmp_path / "run"
    args = ["model=mlp", "max_steps=12", "logger=none", "progress_bar=false"]
    args += [f"hydra.run.dir={run_dir}"]
    stopped = subprocess.run(
        [sys.executable, "-c", UNDER_A_REQUEUEING_HANDLER, str(run_dir), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=seconds(300),
    )
    assert stopped.returncode == 255, stopped.stderr[-2000:]  # the handler's sys.exit(-1)
    assert (run_dir / "handed_over").read_text() == "SIGUSR2 ['step_000000007.pt']"
    assert not (run_dir / "summary.json").exists()

    resumed = run_train(*args, cwd=tmp_path)  # the requeued job: same command, same folder
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in (run_dir / "train.log").read_text()
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 12


def test_a_rerun_of_a_finished_run_trains_nothing_and_keeps_its_summary(tmp_path):
    first = fit(make_cfg("model=mlp", "max_steps=4"), tmp_path)
    written = (tmp_path / "summary.json").read_bytes()
    steps = []
    handle = register_optimizer_step_post_hook(lambda *args: steps.append(1))
    try:
        again = fit(make_cfg("model=mlp", "max_steps=4"), tmp_path)  # resume=auto finds step 4
    finally:
        handle.remove()
    assert steps == []
    assert again.summary == first.summary
    assert (tmp_path / "summary.json").read_bytes() == written


def test_resuming_with_other_settings_names_each_change(tmp_path, caplog):
    fit(make_cfg("model=mlp", "max_steps=2", "optimizer.lr=0.1"), tmp_path)
    longer = fit(make_cfg("model=mlp", "max_steps=4", "optimizer.lr=0.05"), tmp_path)
    assert longer.summary["steps"] == 4  # training goes on from step 2
    [warning] = [r.message for r in caplog.records if "other settings" in r.message]
    assert warning.endswith("max_steps=2 (now 4), optimizer.lr=0.1 (now 0.05)")


def test_resume_from_a_missing_file_is_one_line(tmp_path):
    result = run_train("resume=/missing.pt", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: resume='/missing.pt' is not allowed; no such checkpoint file; "
        "give a checkpoint's path, auto or null"
    )
    assert list(tmp_path.iterdir()) == []


def test_resume_from_another_models_checkpoint_is_one_line(tmp_path):
    fit(make_cfg("model=mlp", "max_steps=1"), tmp_path / "mlp")
    path = latest_checkpoint(tmp_path / "mlp" / "checkpoints")
    run_dir = tmp_path / "cnn"
    result = run_train(
        "model=simple_cnn",
        f"resume={path}",
        "logger=none",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: resume='{path}': the checkpoint holds another model")
    assert "(gearshift.models.MLP)" in line
    assert not run_dir.exists()  # no run folder left behind
