"""A NaN loss stops the run naming its step, keeping the last good checkpoint (stop), or
has its update skipped (skip); an out-of-memory error ends the run with one line."""

from __future__ import annotations

import math
import os
import sys
import warnings

import pytest
import torch
from helpers import ROOT, TINY, StepCounter, SyncCounter, make_cfg, seconds, train_in_process
from test_checkpoint import stop_and_resume
from torch.optim.lr_scheduler import LambdaLR

from gearshift.config import ConfigError, check_config
from gearshift.engine.failures import TrainingFailed
from gearshift.engine.optim import Builtin, schedule_factor
from train import fit

TESTS = ROOT / "tests"
NAN_AT_3 = ("task._target_=injected.NaNLossAt", "+task.at_step=3")


def run_train_py(*args: str, cwd):
    """`python train.py ARGS` with tests/ on the path, for the injected tasks."""
    import subprocess

    paths = [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *TINY, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=seconds(120),
    )


def test_nan_found_at_a_log_step_names_its_step_without_extra_reads(tmp_path, monkeypatch):
    cfg = make_cfg("model=mlp", *NAN_AT_3, "max_steps=10", "log_every_n_steps=5")
    reads = SyncCounter(monkeypatch)
    with pytest.raises(TrainingFailed) as failed:
        fit(cfg, tmp_path)
    assert reads.count == 1  # the loss and the first bad step, read together at step 5
    assert str(failed.value).startswith("non-finite loss (NaN or inf) at step 3; stopped")
    assert "no checkpoint was saved before it" in str(failed.value)
    assert not (tmp_path / "checkpoints").exists()  # nothing poisoned was saved


def test_nan_stops_the_run_with_one_line_and_keeps_the_last_good_checkpoint(tmp_path):
    # checkpoints every 2 steps: step 2 is good; step 4's would hold step 3's NaN update
    done = run_train_py(
        "model=mlp", *NAN_AT_3, "max_steps=10", "log_every_n_steps=5",
        "checkpoint.every_n_steps=2", "hydra.run.dir=run", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    error = lines[-1]
    assert error.startswith("error: non-finite loss (NaN or inf) at step 3; stopped"), lines
    assert [line for line in lines if line.startswith("error:")] == [error]
    kept = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert kept == ["step_000000002"]
    assert f"the last good checkpoint: {tmp_path / 'run/checkpoints/step_000000002'}" in error
    assert error in (tmp_path / "run" / "train.log").read_text()


def test_skip_skips_the_nan_steps_update_and_trains_on(tmp_path):
    cfg = make_cfg("model=mlp", *NAN_AT_3, "on_nonfinite=skip", "max_steps=6")
    with StepCounter() as steps:
        result = fit(cfg, tmp_path)
    assert steps.count == 5  # step 3's optimizer update did not happen
    summary = result.summary
    assert summary["steps"] == 6 and summary["nonfinite_skipped_steps"] == 1
    assert math.isfinite(summary["final_loss"]) and math.isfinite(summary["val_loss"])
    assert all(torch.isfinite(p).all() for p in result.model.parameters())


def test_a_skipped_first_update_still_steps_the_schedule_without_an_order_warning(tmp_path):
    """The schedule steps after every step, also one whose update was skipped: a warm-up
    whose first update is skipped, stopped and resumed (its first update skipped again),
    draws no warning of a schedule stepped before its optimizer (torch's LRScheduler's)."""

    def cfg(*more: str):
        return make_cfg(
            "model=mlp", "task._target_=injected.NaNLossAt", "+task.at_step=1",
            "on_nonfinite=skip", "optimizer.lr_warmup_steps=2", "max_steps=4", *more,
        )  # fmt: skip

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        saved, resumed = stop_and_resume(cfg, tmp_path, step=1)  # after loop step 2
    assert [str(w.message) for w in caught if "lr_scheduler" in str(w.message)] == []
    assert saved["position"]["step"] == 2 and saved["optimizer"]["schedules"][0]["last_epoch"] == 2
    assert resumed.summary["steps"] == 4 and resumed.summary["nonfinite_skipped_steps"] == 1


def test_the_builtin_schedule_goes_on_from_a_lambdalrs_saved_state():
    """Checkpoints written while the built-in schedule was a LambdaLR resume its count."""
    cfg = make_cfg("optimizer.lr_warmup_steps=3", "optimizer.lr=0.5").optimizer
    factor = schedule_factor(cfg, total_steps=10)
    lrs = []
    for schedule in (LambdaLR, Builtin):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
        scheduled = schedule(optimizer, factor)
        for _ in range(4):
            optimizer.step()
            scheduled.step()
        lrs.append(optimizer.param_groups[0]["lr"])
        if schedule is LambdaLR:
            state = scheduled.state_dict()
    assert lrs[0] == lrs[1]
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)  # its peak
    resumed = Builtin(optimizer, factor)
    resumed.load_state_dict(state)
    resumed.step()
    assert resumed.last_epoch == 5 and optimizer.param_groups[0]["lr"] == 0.5 * factor(5)


def test_out_of_memory_ends_the_run_with_one_line_naming_batch_size_and_gears(tmp_path):
    # in this process: the test above runs this exit path (a failed run's line, exit 1) as one
    done = train_in_process(
        *TINY, "model=mlp", "task._target_=injected.OutOfMemoryAt", "+task.at_step=3",
        "max_steps=6", "hydra.run.dir=run", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    error = done.stderr.strip().splitlines()[-1]
    assert error == (
        "error: out of memory at step 3 with batch_size=16 per device (tried to allocate "
        "2.00 GiB); no memory snapshot (profile.memory_snapshot=true records one on CUDA); "
        "to cut memory: amp=on, model.checkpointing=true, batch_size=8, batch_size=auto"
    )
    assert "Traceback" not in done.stderr


def test_out_of_memory_names_only_the_gears_not_on_yet(tmp_path):
    cfg = make_cfg(
        "model=mlp", "task._target_=injected.OutOfMemoryAt", "+task.at_step=2",
        "amp=bf16", "model.checkpointing=true", "batch_size=1", "max_steps=4",
    )  # fmt: skip
    with pytest.raises(TrainingFailed) as failed:
        fit(cfg, tmp_path)
    assert str(failed.value).endswith("; to cut memory: batch_size=auto")


@pytest.mark.gpu
def test_cuda_out_of_memory_dumps_the_snapshot_and_names_it(tmp_path):
    import pickle

    cfg = make_cfg(
        "device=cuda", "model=mlp", "task._target_=injected.AllocatesTooMuchAt",
        "+task.at_step=3", "max_steps=6", "profile.memory_snapshot=true",
    )  # fmt: skip
    with pytest.raises(TrainingFailed) as failed:
        fit(cfg, tmp_path)
    snapshot = tmp_path / "profile" / "memory_snapshot.pickle"
    assert str(failed.value).startswith("out of memory at step 3 with batch_size=16 per device")
    assert f"memory snapshot: {snapshot} (open it at https://pytorch.org/memory_viz)" in str(
        failed.value
    )
    recorded = pickle.loads(snapshot.read_bytes())
    assert recorded["segments"] and recorded["device_traces"][0]  # allocations and their history
    actions = {entry["action"] for entry in recorded["device_traces"][0]}
    assert "oom" in actions  # the failed allocation itself is in the history


@pytest.mark.gpu
def test_memory_snapshot_is_written_at_the_end_of_a_cuda_run(tmp_path):
    import pickle

    cfg = make_cfg("device=cuda", "model=mlp", "max_steps=3", "profile.memory_snapshot=true")
    fit(cfg, tmp_path)
    recorded = pickle.loads((tmp_path / "profile" / "memory_snapshot.pickle").read_bytes())
    assert any(entry["action"] == "alloc" for entry in recorded["device_traces"][0])


def test_loss_watch_sums_micro_batches_per_step_and_names_the_first_bad_one():
    from gearshift.observe.loss_watch import LossWatch

    watch = LossWatch(torch.device("cpu"), steps_between_reads=2)
    losses = {11: [0.5, 0.25], 12: [1.0, float("inf")], 13: [float("nan"), 1.0], 14: [2.0, 2.0]}
    for step, micro_batches in losses.items():  # accum=2; 4 steps overflow the 2 slots
        for loss in micro_batches:
            watch.add(torch.tensor(loss), step)
    sums, first_bad, skipped, (extra,) = watch.read([torch.tensor(7.0)])
    assert first_bad == 12 and math.isnan(sums["loss"]) and skipped == 0 and extra == 7.0
    watch.add(torch.tensor(0.75), 15)  # after a read the slots start afresh
    assert watch.read([])[:2] == ({"loss": 0.75}, None)


def test_loss_watch_skip_mode_leaves_the_bad_step_out_of_the_loss():
    from gearshift.observe.loss_skip import SkippingLossWatch

    watch = SkippingLossWatch(torch.device("cpu"), steps_between_reads=4)
    allowed = []
    for step, loss in enumerate([1.0, float("nan"), 3.0], start=1):
        watch.add(torch.tensor(loss), step)
        allowed.append(watch.update_allowed())
    assert allowed == [True, False, True]
    assert watch.read([])[:3] == ({"loss": 4.0}, None, 1) and watch.skipped == 1


def test_loss_watch_sums_the_tasks_terms_beside_the_loss_and_skips_them_with_it():
    from gearshift.observe.loss_skip import SkippingLossWatch

    watch = SkippingLossWatch(torch.device("cpu"), steps_between_reads=1)
    allowed = []
    # accum=2: each micro-batch's loss arrives divided by 2, its terms are divided here
    for step, (loss, aux) in enumerate([(1.0, 4.0), (float("nan"), 8.0), (3.0, 2.0)], start=1):
        for _ in range(2):
            watch.add(torch.tensor(loss / 2), step, {"aux": torch.tensor(aux)}, window=2)
        allowed.append(watch.update_allowed())
    assert allowed == [True, False, True]  # the loss decides; the skipped step's aux goes too
    assert watch.read([])[:3] == ({"loss": 4.0, "aux": 6.0}, None, 1)
    with pytest.raises(ConfigError, match=r"the terms \['other'\], its first call \['aux'\]"):
        watch.add(torch.tensor(1.0), 4, {"other": torch.tensor(1.0)})


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "profile.memory_snapshot=true",
            "profile.memory_snapshot=True is not allowed; it records the CUDA allocator's "
            "history; this run trains on the CPU",
        ),
        ("profile.active=0", "profile.active=0 is not allowed; expected an integer >= 1"),
        ("on_nonfinite=ignore", "on_nonfinite='ignore' is not allowed; choose one of: stop, skip"),
    ],
)
def test_bad_profile_and_nonfinite_values_are_one_line(override, message):
    with pytest.raises(ConfigError) as error:
        check_config(make_cfg("device=cpu", override))
    assert str(error.value) == message
