"""The loop learns: on synthetic data with class structure, loss falls and accuracy passes 90%."""

from __future__ import annotations

import math

import pytest
from helpers import make_cfg

from train import fit


@pytest.mark.parametrize(
    "gears",
    [(), ("amp=on", "memory_format=channels_last", "accum=2")],
    ids=["baseline", "amp-channels_last-accum2"],
)
def test_loss_falls_and_accuracy_passes_90_percent(tmp_path, gears):
    cfg = make_cfg(
        "model=simple_cnn",
        "data.num_samples=1024",
        "data.num_val_samples=256",
        "data.noise=2.0",
        "batch_size=32",
        "epochs=5",
        *gears,
    )
    summary = fit(cfg, tmp_path).summary
    chance_loss = math.log(cfg.data.num_classes)
    assert summary["final_loss"] < 0.3 * chance_loss
    assert summary["val_accuracy"] > 0.9, summary
