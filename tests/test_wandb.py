"""W&B: offline into the run folder without a key, metrics readable back, failures never fatal."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest
import wandb
from helpers import make_cfg
from wandb_records import history

from gearshift.observe.wandb_logger import wandb_mode
from train import fit


def test_mode_is_offline_without_a_key_and_online_with_one(no_wandb_key, monkeypatch):
    assert wandb_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_mode("auto") == "online"
    assert wandb_mode("disabled") == "disabled"


def test_offline_run_in_the_run_folder_holds_the_logged_metrics(no_wandb_key, tmp_path):
    cfg = make_cfg(
        "model=mlp", "logger=wandb", "max_steps=10", "log_every_n_steps=5", "warmup_steps=0"
    )
    summary = fit(cfg, tmp_path).summary
    [log_file] = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    rows = history(log_file)
    train_rows = [r for r in rows if "train/loss" in r]
    assert [r["_step"] for r in train_rows] == [5, 10]
    for row in train_rows:
        for key in ("perf/samples_per_sec", "perf/step_time_ms", "perf/data_wait_pct", "train/lr"):
            assert row[key] >= 0, key
        assert row["mem/peak_rss_gib"] > 0
    assert train_rows[-1]["train/loss"] == pytest.approx(summary["final_loss"])
    assert any("val/accuracy" in r for r in rows)


def test_fp16_logs_grad_scale_and_skipped_steps(no_wandb_key, tmp_path):
    cfg = make_cfg("model=mlp", "logger=wandb", "amp=fp16", "max_steps=4", "log_every_n_steps=2")
    fit(cfg, tmp_path)
    [log_file] = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    row = next(r for r in history(log_file) if "train/loss" in r)
    assert row["amp/grad_scale"] > 0 and row["amp/skipped_steps"] >= 0


def test_wandb_failing_to_start_does_not_stop_training(no_wandb_key, tmp_path, monkeypatch, caplog):
    def broken_init(**kwargs):
        raise RuntimeError("no W&B today")

    monkeypatch.setattr(wandb, "init", broken_init)
    fit(make_cfg("model=mlp", "logger=wandb", "max_steps=3"), tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 3
    assert "W&B is off for this run: no W&B today" in caplog.text


def test_wandb_failing_mid_run_does_not_stop_training(no_wandb_key, tmp_path, monkeypatch, caplog):
    class FlakyRun:
        name = "flaky"
        summary: ClassVar[dict] = {}

        def log(self, *args, **kwargs):
            raise ConnectionError("network gone")

        def finish(self):
            pass

    monkeypatch.setattr(wandb, "init", lambda **kwargs: FlakyRun())
    fit(make_cfg("model=mlp", "logger=wandb", "max_steps=6", "log_every_n_steps=2"), tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 6
    assert caplog.text.count("network gone") == 1  # warned once, then off
