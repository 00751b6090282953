"""Loggers: W&B, TensorBoard and CSV get the same metrics; several at once; failures never fatal."""

from __future__ import annotations

import csv
import importlib.util
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import make_cfg
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter
from wandb_records import history

from gearshift.app import _overrides_to_check
from gearshift.config import ConfigError, check_config
from gearshift.observe import csv_logger
from train import fit

# Log at every step but the first and validate mid-run, so each backend sees every family
# of metrics (train/, perf/, mem/, val/) and a metric (val/...) that first appears late.
SHORT_RUN = ("model=mlp", "max_steps=6", "log_every_n_steps=2", "warmup_steps=0")


def csv_metrics(path: Path) -> dict[tuple[int, str], float]:
    with path.open(newline="") as file:
        rows = list(csv.reader(file))
    assert rows[0] == ["step", "name", "value"]
    found = {(int(step), name): float(value) for step, name, value in rows[1:]}
    assert len(found) == len(rows) - 1, "a (step, metric) pair is in the file twice"
    return found


def tensorboard_metrics(folder: Path) -> dict[tuple[int, str], float]:
    events = EventAccumulator(str(folder))
    events.Reload()
    found = {}
    for tag in events.Tags()["scalars"]:
        for event in events.Scalars(tag):
            assert (event.step, tag) not in found, (event.step, tag)
            found[event.step, tag] = event.value
    return found


def wandb_metrics(run_dir: Path) -> dict[tuple[int, str], float]:
    [log_file] = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    found = {}
    for row in history(log_file):
        for key, value in row.items():
            if not key.startswith("_"):  # W&B's own: _step, _runtime, _timestamp
                found[row["_step"], key] = value
    return found


@pytest.mark.parametrize(
    ("overrides", "selected"),
    [
        ((), ("wandb",)),  # the default
        (("logger=[wandb,csv]",), ("wandb", "csv")),
        (("logger=[tensorboard,csv]",), ("tensorboard", "csv")),
        (("logger=csv", "logger.tensorboard=true"), ("tensorboard", "csv")),
        (("logger=none",), ()),
    ],
)
def test_logger_group_selects_one_or_several_backends(overrides, selected):
    chosen = make_cfg(*overrides, tiny=False).logger
    assert {name for name in ("wandb", "tensorboard", "csv") if chosen[name]} == set(selected)


def test_a_sweep_over_logger_lists_runs_each_list():
    sweep = ["logger=[wandb,csv],[tensorboard]"]
    [jobs] = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(sweep), None)
    assert jobs == [["logger=[wandb,csv]"], ["logger=[tensorboard]"]]  # Hydra's two runs
    checked = [swept for _, swept in _overrides_to_check(sweep)]  # and preflight's
    assert checked == [None, "logger=[wandb,csv]", "logger=[tensorboard]"]  # None: the fixed part
    chosen = [make_cfg(*job).logger for job in jobs]
    assert [(c.wandb, c.tensorboard, c.csv) for c in chosen] == [(1, 0, 1), (0, 1, 0)]


def test_tensorboard_and_csv_hold_what_wandb_holds(no_wandb_key, tmp_path):
    cfg = make_cfg(*SHORT_RUN, "logger=[wandb,tensorboard,csv]", "val_every_n_steps=3")
    summary = fit(cfg, tmp_path).summary
    from_wandb = wandb_metrics(tmp_path)
    from_csv = csv_metrics(tmp_path / "metrics.csv")
    from_tensorboard = tensorboard_metrics(tmp_path / "tensorboard")

    names = {name for _, name in from_wandb}
    assert {"train/loss", "perf/samples_per_sec", "mem/peak_gib", "val/loss"} <= names
    assert sorted({step for step, name in from_wandb if name == "val/loss"}) == [3, 6]
    assert sorted({step for step, name in from_wandb if name == "train/loss"}) == [2, 4, 6]
    assert from_csv == from_wandb  # the same keys and, as text, the same float64 values
    assert from_tensorboard.keys() == from_wandb.keys()
    for key, value in from_wandb.items():  # TensorBoard keeps scalars as float32
        assert from_tensorboard[key] == np.float32(value), key
    assert from_csv[6, "train/loss"] == summary["final_loss"]
    assert from_csv[6, "val/accuracy"] == summary["val_accuracy"]


def test_a_resumed_run_logs_each_step_once(tmp_path):
    args = ("model=mlp", "max_steps=6", "log_every_n_steps=1", "logger=[tensorboard,csv]")
    whole = tmp_path / "whole"
    fit(make_cfg(*args), whole)
    cut = tmp_path / "cut"
    fit(make_cfg(*args, "checkpoint.every_n_steps=3"), cut)
    # As if killed after step 5, in the middle of a line: step 6 and the summary never
    # came, and the next run resumes from the checkpoint of step 3.
    (cut / "summary.json").unlink()
    shutil.rmtree(cut / "checkpoints" / "step_000000006")
    lines = (cut / "metrics.csv").read_text().splitlines(keepends=True)
    kept = [line for line in lines if not line.startswith("6,")]
    (cut / "metrics.csv").write_text("".join(kept) + "6,train/lo")
    fit(make_cfg(*args, "checkpoint.every_n_steps=3"), cut)

    def losses(found: dict) -> dict[int, float]:
        return {step: value for (step, name), value in found.items() if name == "train/loss"}

    expected = losses(csv_metrics(whole / "metrics.csv"))
    assert sorted(expected) == [1, 2, 3, 4, 5, 6]
    assert losses(csv_metrics(cut / "metrics.csv")) == expected  # exact resume, no duplicates
    resumed_tb = losses(tensorboard_metrics(cut / "tensorboard"))
    assert resumed_tb == losses(tensorboard_metrics(whole / "tensorboard"))


def test_backends_failing_at_start_do_not_stop_training(tmp_path, caplog):
    (tmp_path / "metrics.csv").mkdir()  # where the file must go
    (tmp_path / "tensorboard").write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="gearshift"):
        fit(make_cfg(*SHORT_RUN, "logger=[tensorboard,csv]"), tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 6
    assert "CSV is off for this run" in caplog.text
    assert "TensorBoard is off for this run" in caplog.text


def test_backends_failing_mid_run_keep_what_they_logged(tmp_path, monkeypatch, caplog):
    real_add_scalar, calls = SummaryWriter.add_scalar, []

    def add_scalar(self, *args, **kwargs):
        calls.append(args[0])
        if len(calls) > 3:
            raise OSError("disk full (tensorboard)")
        return real_add_scalar(self, *args, **kwargs)

    real_writer, writes = csv_logger.csv.writer, []

    class FailingSecondTime:
        def __init__(self, file):
            self.writer = real_writer(file)

        def writerows(self, rows):
            writes.append(rows)
            if len(writes) > 2:  # the header, then the first log step's rows
                raise OSError("disk full (csv)")
            self.writer.writerows(rows)

    monkeypatch.setattr(SummaryWriter, "add_scalar", add_scalar)
    monkeypatch.setattr(csv_logger.csv, "writer", FailingSecondTime)
    with caplog.at_level(logging.WARNING, logger="gearshift"):
        fit(make_cfg(*SHORT_RUN, "logger=[tensorboard,csv]"), tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 6
    assert caplog.text.count("disk full (csv)") == 1  # warned once, then off
    assert caplog.text.count("disk full (tensorboard)") == 1
    steps = {step for step, _ in csv_metrics(tmp_path / "metrics.csv")}
    assert steps == {2}  # the rows of the first log step stay


def test_tensorboard_not_installed_is_one_line_at_preflight(monkeypatch):
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        return None if name == "tensorboard" else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    check_config(make_cfg("logger=csv"))  # the others need nothing more
    with pytest.raises(ConfigError) as error:
        check_config(make_cfg("logger=[wandb,tensorboard]"))
    message = str(error.value)
    assert message.startswith("logger='tensorboard' is not allowed;") and "\n" not in message
    assert "pip install tensorboard" in message
