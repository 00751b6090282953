"""The data position is a count of the epoch's samples: a run resumed with another batch
size or on another number of ranks trains each of the interrupted epoch's samples once."""

from __future__ import annotations

import signal

import pytest
import torch
from helpers import make_cfg, recording_epoch_samples
from test_checkpoint import SignalAtStep

from gearshift.data.host_loader import EpochSampler
from gearshift.data.loading import DeviceBatches
from gearshift.data.loading_base import epoch_order
from gearshift.state.budget import Trained, epoch_steps
from gearshift.state.checkpoint_folders import latest_checkpoint
from gearshift.state.checkpoint_reads import load_checkpoint
from gearshift.state.position import Position
from gearshift.state.preemption import TrainingStopped
from train import fit


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2), (2, 4)])
def test_the_rest_of_an_epoch_is_dealt_to_any_number_of_ranks(before, after):
    n, taken = 96, 32  # 32 samples taken on `before` ranks, the other 64 on `after`
    first = [epoch_order(n, 3, 0, True, r, before)[: taken // before] for r in range(before)]
    rest = [epoch_order(n, 3, 0, True, r, after, start=taken) for r in range(after)]
    seen = torch.cat(first + rest).tolist()
    assert sorted(seen) == list(range(n))  # every sample of the epoch once
    assert torch.equal(torch.cat(first).sort().values, torch.randperm(n, generator=torch.Generator().manual_seed(3))[:taken].sort().values)  # fmt: skip


def test_a_start_on_the_same_ranks_continues_the_epochs_order_exactly():
    for rank in range(2):
        whole = epoch_order(37, 1, 0, True, rank, 2)
        assert torch.equal(epoch_order(37, 1, 0, True, rank, 2, start=2 * 8), whole[8:])


def test_loaders_start_at_a_sample_and_count_the_batches_left():
    sampler = EpochSampler(100, shuffle=True, seed=0, rank=1, world_size=2)
    sampler.set_epoch(2, start=40)
    assert len(sampler) == 30 and list(sampler) == epoch_order(100, 2, 0, True, 1, 2)[20:].tolist()
    device = DeviceBatches(torch.arange(100.0), torch.arange(100), 8, True, False, 0)
    device.set_epoch(2, start=40)
    assert len(device) == 8  # 60 samples left: 7 batches of 8 and one of 4
    assert torch.cat([y for _, y in device]).tolist() == epoch_order(100, 2, 0, True, 0, 1)[40:].tolist()  # fmt: skip


def test_the_position_saves_samples_and_an_old_checkpoints_batches_still_load():
    p = Position(step=5, epoch=1, batch=3, samples=0, global_batch=32, epoch_batches=8)
    assert p.state_dict()["epoch_samples"] == 96
    p.batch = 8  # the epoch's last batch taken: the next one starts the next epoch
    assert (p.state_dict()["epoch"], p.state_dict()["epoch_samples"]) == (2, 0)
    resumed = Position(global_batch=16)
    resumed.load_state_dict({"step": 5, "epoch": 1, "batch": 3, "samples": 0})  # before samples
    assert (resumed.epoch_start, resumed.batch) == (48, 0)


@pytest.mark.parametrize("resumed_batch", [8, 32])
def test_a_resume_with_another_batch_size_trains_each_sample_of_the_epoch_once(
    tmp_path, resumed_batch
):
    gears = ("model=mlp", "data.image_size=8", "data.num_samples=128", "data.on_device=false")
    gears += ("dataloader.num_workers=0", "epochs=1", "data.num_val_samples=0")
    with recording_epoch_samples() as taken:
        with SignalAtStep(3, signal.SIGTERM), pytest.raises(TrainingStopped):
            fit(make_cfg(*gears, "batch_size=16"), tmp_path)
        position = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))["position"]
        assert position["epoch_samples"] == 3 * 16 and len(taken) == 3 * 16
        summary = fit(make_cfg(*gears, f"batch_size={resumed_batch}"), tmp_path).summary
    assert sorted(taken) == list(range(128))  # the epoch's 128 samples, each once
    assert summary["steps"] == 3 + -(-(128 - 48) // resumed_batch)


def test_a_resume_at_another_batch_size_ends_the_schedule_where_the_epochs_end():
    # 512 samples, 2 epochs: 32 steps an epoch at batch 16. Stopped after step 20 (320
    # samples) and resumed at batch 32: the 704 samples left are 22 steps, so 42 in all.
    steps = 2 * 16  # 2 epochs of 16 batches, accum=1: at 32 samples a step
    assert epoch_steps(steps, 32, Trained(step=20, samples=320, per_step=16)) == 42
    assert epoch_steps(steps, 32, Trained(step=10, samples=320, per_step=32)) == 32
    assert epoch_steps(steps, 32) == 32  # a fresh run: 2 x 16 steps
    half = 2 * 8  # accum=2: 2 epochs of 8 steps; 2 ranks x 16 x 2: 64 a step
    assert epoch_steps(half, 64, Trained(step=20, samples=320, per_step=16)) == 20 + 11
