"""Sharded checkpoints (DCP) resumed at another world size and strategy (CPU, gloo, spawned
ranks): the model and optimizer come back as saved, and the interrupted epoch's samples are
each trained once."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from distributed_workers import (
    count_allreduces,
    restored_state,
    train_recording_samples,
    train_sharded,
)
from helpers import make_cfg, on_ranks, recording_epoch_samples

from gearshift.state.checkpoint_folders import latest_checkpoint
from gearshift.state.checkpoint_reads import load_checkpoint
from train import fit

# AdamW: two moments per parameter (and a step count) that must come back resharded
COMMON = ["model=mlp", "optimizer=adamw", "optimizer.schedule=constant", "batch_size=8"]
COMMON += ["data.num_val_samples=0"]


def train(out: Path, ranks: int, strategy: str, *extra: str) -> Path:
    """3 steps on `ranks` ranks under `strategy`; the checkpoint they end with."""
    overrides = [*COMMON, "max_steps=3", *extra]
    if ranks == 1:
        fit(make_cfg(*overrides), out / "rank0")
    elif strategy == "fsdp":
        on_ranks(train_sharded, ranks, out, overrides)
    else:
        on_ranks(count_allreduces, ranks, out, [*overrides, f"distributed={strategy}"])
    return latest_checkpoint(out / "rank0" / "checkpoints")


def assert_restored_as_saved(checkpoint: Path, out: Path, ranks: int, strategy: str) -> None:
    on_ranks(
        restored_state, ranks, out, [*COMMON, f"distributed={strategy}", f"resume={checkpoint}"]
    )
    restored = torch.load(out / "restored.pt", weights_only=False)
    saved = load_checkpoint(checkpoint)  # consolidated in this process
    assert restored["strategy"] == (strategy if ranks > 1 else "none")
    for key in ("step", "epoch", "epoch_samples"):  # the global batch is this layout's own
        assert restored["position"][key] == saved["position"][key], key
    assert restored["model"].keys() == saved["model"].keys()
    for name, tensor in saved["model"].items():
        assert torch.equal(restored["model"][name], tensor), name
    state = saved["optimizer"]["state"]
    assert state.keys() == restored["optimizer"]["state"].keys() == saved["model"].keys()
    for name, moments in state.items():
        assert moments.keys() == {"step", "exp_avg", "exp_avg_sq"}
        for key, tensor in moments.items():
            assert torch.equal(restored["optimizer"]["state"][name][key], tensor), (name, key)
    assert state["1.weight"]["step"] == 3 and state["1.weight"]["exp_avg"].abs().sum() > 0


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ((2, "fsdp"), (1, "none")),
        ((1, "none"), (2, "ddp")),
        ((2, "ddp", "checkpoint.async_save=true"), (2, "fsdp")),  # written in the background
    ],
    ids=["2-rank-fsdp-to-1-process", "1-process-to-2-rank-ddp", "2-rank-ddp-async-to-2-rank-fsdp"],
)
def test_a_checkpoint_loads_resharded_at_another_size_and_strategy(tmp_path, before, after):
    checkpoint = train(tmp_path / "trained", *before)
    assert_restored_as_saved(checkpoint, tmp_path / "restored", *after)


@pytest.mark.slow  # the 2-rank -> 2-rank FSDP case above takes the same resharding path
def test_a_2_rank_checkpoint_loads_on_4_fsdp_ranks(tmp_path):
    checkpoint = train(tmp_path / "trained", 2, "ddp")
    assert_restored_as_saved(checkpoint, tmp_path / "restored", 4, "fsdp")


def test_2_ranks_x_16_resumed_as_1_x_32_take_each_sample_once_and_end_equal(tmp_path, caplog):
    # 256 samples, 32 a step: 3 steps on 2 ranks (96 samples), the other 5 on one process;
    # SGD with momentum (AdamW's division by its second moment magnifies rounding)
    data = ["model=mlp", "optimizer=sgd", "optimizer.schedule=constant", "epochs=1"]
    data += ["data.on_device=false", "dataloader.num_workers=0", "data.num_val_samples=0"]
    ranks = on_ranks(
        train_recording_samples, 2, tmp_path / "parts", [*data, "batch_size=16", "max_steps=3"]
    )
    before = [i for rank in ranks for i in rank["taken"]]
    assert len(before) == 96 and ranks[0]["summary"]["steps"] == 3
    assert ranks[0]["summary"]["samples"] == 96  # the job's, over both ranks

    with recording_epoch_samples() as after, caplog.at_level(logging.INFO, logger="gearshift"):
        resumed = fit(make_cfg(*data, "batch_size=32"), tmp_path / "parts" / "rank0")
    assert sorted(before + after) == list(range(256))  # the epoch's samples, each once
    assert resumed.summary["steps"] == 8
    assert resumed.summary["samples"] == 256  # the job's: 96 on 2 ranks, then 160 on one
    [layout] = [r.message for r in caplog.records if "another layout" in r.message]
    assert "world size 2 -> 1" in layout and "strategy ddp -> none" in layout
    assert "global batch" not in layout  # 2 x 16 and 1 x 32: the same global batch
    assert any("random streams are reseeded" in r.message for r in caplog.records)

    whole = fit(make_cfg(*data, "batch_size=32"), tmp_path / "whole")
    for name, tensor in whole.model.state_dict().items():
        # the same 32 samples a step; 2 ranks' gradient means averaged in another order
        torch.testing.assert_close(resumed.model.state_dict()[name], tensor, rtol=1e-5, atol=1e-6)
