"""Checkpoints: atomic saves, exact resume (in-process and after a real SIGTERM), clear errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

import pytest
import torch
from helpers import ROOT, make_cfg, run_train, seconds, train_in_process
from torch.optim.optimizer import register_optimizer_step_post_hook

from gearshift import evaluate, export
from gearshift.reporting import RunResult
from gearshift.state.checkpoint_failures import CheckpointWriteFailed
from gearshift.state.checkpoint_folders import latest_checkpoint
from gearshift.state.checkpoint_reads import load_checkpoint
from gearshift.state.checkpointer import RngState
from gearshift.state.preemption import TrainingStopped
from train import fit


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


def stop_and_resume(cfg, run_dir: Path, step: int) -> tuple[dict, RunResult]:
    """`fit(cfg())` in `run_dir`, stopped by SIGTERM right after optimizer step `step`, then
    resumed with `cfg("resume=auto")`: the checkpoint the stop saved, and the resumed run."""
    with SignalAtStep(step, signal.SIGTERM), pytest.raises(TrainingStopped):
        fit(cfg(), run_dir)
    saved = load_checkpoint(latest_checkpoint(run_dir / "checkpoints"))
    return saved, fit(cfg("resume=auto"), run_dir)


def assert_a_stream_or_index_source_resumes_exactly(source, tmp_path: Path, streaming: bool):
    """`source(*overrides)`'s config for 21 training images (3 batches an epoch), stopped
    after step 4, mid-epoch, then resumed: equal to an uninterrupted run; a stream keeps its
    own position, the epoch's 13 samples still to train."""
    gears = (
        "model=simple_cnn", "max_steps=7", "data.augment=true", f"data.streaming={streaming}",
        f"dataloader.num_workers={2 if streaming else 0}",  # a stream: dealt to the workers
    )  # fmt: skip
    whole = fit(source(*gears), tmp_path / "whole")
    saved, resumed = stop_and_resume(partial(source, *gears), tmp_path / "stopped", step=4)
    assert saved["position"]["epoch"] == 1 and saved["position"]["epoch_samples"] == 8  # mid-epoch
    if streaming:
        assert saved["position"]["stream"]["epoch"] == 1
        assert sum(b - a for a, b in saved["position"]["stream"]["remaining"]) == 13
    assert_same_parameters(resumed.model, whole.model)


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
        "step": 11, "epoch": 1, "epoch_samples": 6 * 16, "samples": 11 * 32, "trained": 11 * 32,
        "global_batch": 16,
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
        "step": 6, "epoch": 1, "epoch_samples": 4 * 16, "samples": 6 * 32, "trained": 6 * 32,
        "global_batch": 16,
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
    # 3, 6 dropped; 10 = the end; best (the one validation, at the end) is no step checkpoint
    assert names == ["best", "step_000000009", "step_000000010"]
    # step 10 is best/'s files, hard links (the validation at the end was the best)
    assert (tmp_path / "checkpoints" / "step_000000010" / ".metadata").stat().st_nlink == 2


def test_resume_auto_without_checkpoints_starts_fresh(tmp_path):
    assert fit(make_cfg("model=mlp", "max_steps=2", "resume=auto"), tmp_path).summary["steps"] == 2


# A run saving every 2 steps, killed by SIGKILL inside its second save: while the shard file
# is half written, or once the shards are complete but before DCP's metadata.
KILLED_SAVE = """
import os, signal, sys
from pathlib import Path
import torch.distributed.checkpoint.filesystem as fs
sys.path.insert(0, sys.argv[3])
from helpers import make_cfg
from train import fit
moment, saves = sys.argv[2], []  # sys.argv[4:]: more overrides
write_item, finish = fs._write_item, fs._FileSystemWriter.finish
def killing_write_item(transforms, stream, data, *args, **kwargs):
    if moment == "mid-shard" and len(saves) == 1:
        stream.write(b"torn" * 1000)
        stream.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return write_item(transforms, stream, data, *args, **kwargs)
def killing_finish(self, *args, **kwargs):
    if moment == "before-metadata" and len(saves) == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    saves.append(1)
    return finish(self, *args, **kwargs)
fs._write_item, fs._FileSystemWriter.finish = killing_write_item, killing_finish
fit(make_cfg(*COMMON, "max_steps=6", *sys.argv[4:]), Path(sys.argv[1]))
"""

KILLED_COMMON = ("model=mlp", "checkpoint.every_n_steps=2", "data.num_val_samples=0")


@pytest.mark.parametrize(
    ("moment", "saving"),
    [("mid-shard", ()), ("before-metadata", ()), ("mid-shard", ("checkpoint.async_save=true",))],
    ids=["mid-shard", "before-metadata", "mid-shard-async"],  # async: the background write
)
def test_a_save_killed_mid_write_leaves_the_previous_checkpoint_for_resume(
    tmp_path, moment, saving
):
    run_dir = tmp_path / "run"
    script = KILLED_SAVE.replace("*COMMON", f"*{KILLED_COMMON!r}")
    crash = subprocess.run(
        [sys.executable, "-c", script, str(run_dir), moment, str(ROOT / "tests"), *saving],
        timeout=seconds(120),
    )
    assert crash.returncode == -signal.SIGKILL
    folder = run_dir / "checkpoints"
    torn = folder / ".step_000000004.tmp"
    assert torn.is_dir() and any(torn.glob("*.distcp"))  # the torn save's shard is there
    assert not (torn / ".metadata").exists()
    assert latest_checkpoint(folder) == folder / "step_000000002"
    assert load_checkpoint(folder / "step_000000002")["position"]["step"] == 2

    whole = fit(make_cfg(*KILLED_COMMON, "max_steps=6"), tmp_path / "whole")
    resumed = fit(make_cfg(*KILLED_COMMON, "max_steps=6"), run_dir)  # resume=auto: step 2
    assert resumed.summary["samples"] == whole.summary["samples"]
    assert_same_parameters(resumed.model, whole.model)
    assert not torn.exists()  # removed by the next save
    assert sorted(p.name for p in folder.iterdir()) == ["step_000000004", "step_000000006"]


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
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
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
    assert (run_dir / "handed_over").read_text() == "SIGUSR2 ['step_000000007']"
    assert not (run_dir / "summary.json").exists()

    # the requeued job: same command, same folder (run here: the signal is the process's part)
    resumed = train_in_process(*args, cwd=tmp_path)
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
    # no training step: at most the zero-gradient step at lr 0 with which DCP's
    # get_optimizer_state_dict creates an empty optimizer's state before loading it
    assert len(steps) <= 1
    assert_same_parameters(again.model, first.model)
    assert again.summary == first.summary
    assert (tmp_path / "summary.json").read_bytes() == written


def test_resuming_with_other_settings_names_each_change(tmp_path, caplog):
    fit(make_cfg("model=mlp", "max_steps=2", "optimizer.lr=0.1"), tmp_path)
    longer = fit(make_cfg("model=mlp", "max_steps=4", "optimizer.lr=0.05"), tmp_path)
    assert longer.summary["steps"] == 4  # training goes on from step 2
    [warning] = [r.message for r in caplog.records if "other settings" in r.message]
    assert warning.endswith("max_steps=2 (now 4), optimizer.lr=0.1 (now 0.05)")


def test_resume_from_a_missing_file_is_one_line(tmp_path):
    result = train_in_process("resume=/missing.pt", cwd=tmp_path)
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
    result = train_in_process(
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
    assert "17 missing ('0.weight', '1.num_batches_tracked')" in line  # the first ones named
    assert not run_dir.exists()  # no run folder left behind


def test_a_checkpoint_folder_missing_a_shard_is_one_line_for_train_evaluate_and_export(
    tmp_path, capsys
):
    fit(make_cfg("model=mlp", "max_steps=1"), tmp_path / "mlp")
    path = latest_checkpoint(tmp_path / "mlp" / "checkpoints")
    (path / "__0_0.distcp").unlink()  # a copy that lost a file
    expected = f"error: resume='{path}': shard file __0_0.distcp is missing; the checkpoint is incomplete"  # fmt: skip
    run_dir = tmp_path / "resumed"
    result = train_in_process(
        "model=mlp", f"resume={path}", f"hydra.run.dir={run_dir}", cwd=tmp_path
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1:] == [expected]
    assert "Traceback" not in result.stderr and not run_dir.exists()
    assert evaluate.main([f"resume={path}", f"--output={tmp_path / 'eval.json'}"]) == 2
    assert export.main([f"resume={path}", f"out={tmp_path / 'exported'}"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [expected, expected]
    assert not (tmp_path / "eval.json").exists() and not (tmp_path / "exported").exists()


ASYNC = ("model=mlp", "max_steps=6", "checkpoint.every_n_steps=2", "checkpoint.keep=5")


def test_async_saves_hold_what_sync_saves_hold_and_the_loop_goes_on_during_a_write(
    tmp_path, monkeypatch
):
    sync = fit(make_cfg(*ASYNC), tmp_path / "sync")
    import torch.distributed.checkpoint.filesystem as fs

    write, during = fs._write_files_from_queue, []
    steps, stepped = [0], threading.Condition()

    def count_step(*args):
        with stepped:
            steps[0] += 1
            stepped.notify_all()

    handle = register_optimizer_step_post_hook(count_step)

    def slow_write(*args, **kwargs):  # step 2's write lasts until step 3 is done, 4's until 5
        if len(during) < 2:
            after = 2 * len(during) + 3  # a count, not an event: the writer may start late
            with stepped:
                during.append(stepped.wait_for(lambda: steps[0] >= after, seconds(30)))
        return write(*args, **kwargs)

    monkeypatch.setattr(fs, "_write_files_from_queue", slow_write)
    try:
        result = fit(make_cfg(*ASYNC, "checkpoint.async_save=true"), tmp_path / "async")
    finally:
        handle.remove()
    assert during == [True, True]  # the loop trained on while they were written
    assert_same_parameters(result.model, sync.model)
    names = sorted(p.name for p in (tmp_path / "async" / "checkpoints").iterdir())
    assert names == ["best", "step_000000002", "step_000000004", "step_000000006"]
    for step in (2, 4, 6):
        name = f"step_{step:09d}"
        a = load_checkpoint(tmp_path / "async" / "checkpoints" / name)
        s = load_checkpoint(tmp_path / "sync" / "checkpoints" / name)
        assert a["position"] == s["position"] and a["position"]["step"] == step
        for key, tensor in s["model"].items():
            assert torch.equal(a["model"][key], tensor), (step, key)


def test_a_stop_waits_for_the_async_write_before_it_ends(tmp_path):
    with SignalAtStep(3), pytest.raises(TrainingStopped) as stopped:
        fit(make_cfg(*ASYNC, "checkpoint.async_save=true"), tmp_path)
    # the exception comes after the write: the folder is in place, complete
    assert stopped.value.checkpoint == tmp_path / "checkpoints" / "step_000000003"
    assert latest_checkpoint(tmp_path / "checkpoints") == stopped.value.checkpoint
    assert load_checkpoint(stopped.value.checkpoint)["position"]["step"] == 3
    resumed = fit(make_cfg(*ASYNC, "checkpoint.async_save=true"), tmp_path)
    assert resumed.summary["steps"] == 6


def test_a_failed_background_write_ends_the_run_with_one_line(tmp_path, monkeypatch):
    import torch.distributed.checkpoint.filesystem as fs

    write, writes = fs._write_files_from_queue, []

    def failing_write(*args, **kwargs):  # the second save's write fails (a full disk)
        writes.append(1)
        if len(writes) == 2:
            raise OSError(28, "No space left on device")
        return write(*args, **kwargs)

    monkeypatch.setattr(fs, "_write_files_from_queue", failing_write)
    cfg = make_cfg(*ASYNC, "checkpoint.async_save=true", "data.num_val_samples=0")
    with pytest.raises(CheckpointWriteFailed) as failed:
        fit(cfg, tmp_path)
    message = str(failed.value)
    assert "\n" not in message and "step_000000004 failed" in message
    assert "No space left on device" in message
    assert message.endswith(f"the newest complete checkpoint is {tmp_path / 'checkpoints' / 'step_000000002'}")  # fmt: skip
    assert latest_checkpoint(tmp_path / "checkpoints").name == "step_000000002"


def test_an_older_single_file_checkpoint_still_resumes(tmp_path):
    # what runs before DCP wrote: one torch.save of every part, the optimizer keyed by position
    gears = ("model=mlp", "optimizer.schedule=constant", "data.num_val_samples=0")
    whole = fit(make_cfg(*gears, "max_steps=4"), tmp_path / "whole")
    first = fit(make_cfg(*gears, "max_steps=2"), tmp_path / "first")
    state = load_checkpoint(latest_checkpoint(tmp_path / "first" / "checkpoints"))
    (optimizer,) = first.optimizers.optimizers
    state |= {"optimizer": optimizer.state_dict(), "rng": RngState().state_dict()}
    old = tmp_path / "old" / "step_000000002.pt"
    old.parent.mkdir()
    torch.save(state, old)
    assert latest_checkpoint(old.parent) == old
    resumed = fit(make_cfg(*gears, "max_steps=4", f"resume={old}"), tmp_path / "resumed")
    assert resumed.summary["steps"] == 4
    assert_same_parameters(resumed.model, whole.model)
