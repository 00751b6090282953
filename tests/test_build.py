"""build.py and the Checkpointer: a run's parts are built once with their decisions, the
checkpoint is read once per start, and a resumed amp=on keeps the dtype it resolved to."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from helpers import make_cfg

import gearshift.build
from gearshift import config_advice, evaluate
from gearshift.engine import cpu_probe
from gearshift.state import checkpoint_reads
from gearshift.state.checkpoint_folders import latest_checkpoint
from gearshift.state.checkpoint_reads import Saved, load_checkpoint
from train import fit

SMALL = ("model=mlp", "data.image_size=8", "data.num_val_samples=32")

# summary.json's gears of the default run, key by key, as the build decided them before it
# was one module (main at dee8968); the data sources add their own keys to these.
DEFAULT_GEARS = {
    "accum", "amp", "amp_reason", "batch_size", "checkpointing", "compile", "compile_reason",
    "cudnn_benchmark", "data_decode", "data_on_device", "deterministic", "device_transforms",
    "distributed", "foreach", "fused", "grad_scaler", "matmul_precision", "memory_format",
    "non_blocking", "num_workers", "num_workers_reason", "optimizer", "pin_memory",
    "prefetch_to_device", "set_to_none",
}  # fmt: skip


def fake_cpu_probe(monkeypatch, bf16_speed: float) -> None:
    """amp=on's CPU probe, measuring bf16 at `bf16_speed` x float32 (no timing involved)."""
    monkeypatch.setattr(
        cpu_probe,
        "cpu_speed",
        lambda dtype: cpu_probe.CpuSpeed(dtype, bf16_speed, bf16_speed),
    )
    monkeypatch.setattr(cpu_probe, "native_kernels", lambda dtype: dtype == torch.bfloat16)


def test_the_summarys_gears_are_the_builds_decisions(tmp_path):
    summary = fit(make_cfg(*SMALL, "max_steps=2"), tmp_path).summary
    assert set(summary["gears"]) == DEFAULT_GEARS
    assert summary["gears"]["num_workers"] == 0
    assert summary["gears"]["num_workers_reason"] == "data.on_device=true: no loader"


def test_amp_on_keeps_the_dtype_it_resolved_to_when_the_run_resumes(tmp_path, monkeypatch, caplog):
    fake_cpu_probe(monkeypatch, bf16_speed=2.0)
    first = fit(make_cfg(*SMALL, "amp=on", "max_steps=2"), tmp_path).summary
    assert first["gears"]["amp"] == "bfloat16"
    saved = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))
    assert saved["decisions"] == first["gears"]  # the record summary.json shows
    assert saved["decisions"]["amp"] == "bfloat16" and saved["config"]["amp"]["dtype"] == "auto"

    fake_cpu_probe(monkeypatch, bf16_speed=0.2)  # a busy machine: the probe now says float32
    with caplog.at_level(logging.INFO, logger="gearshift"):
        resumed = fit(make_cfg(*SMALL, "amp=on", "max_steps=4"), tmp_path).summary
    assert resumed["steps"] == 4 and resumed["gears"]["amp"] == "bfloat16"
    assert resumed["gears"]["amp_reason"] == first["gears"]["amp_reason"]
    assert "amp=on: bfloat16, as resolved when this run started" in caplog.text


def test_an_explicit_amp_on_the_resuming_command_wins_and_says_so(tmp_path, monkeypatch, caplog):
    fake_cpu_probe(monkeypatch, bf16_speed=2.0)
    fit(make_cfg(*SMALL, "amp=on", "max_steps=2"), tmp_path)
    with caplog.at_level(logging.INFO, logger="gearshift"):
        resumed = fit(make_cfg(*SMALL, "amp=off", "max_steps=4"), tmp_path).summary
    assert resumed["steps"] == 4 and resumed["gears"]["amp"] == "off"
    assert "the checkpoint trained with bfloat16 (amp=on); this command's amp wins" in caplog.text


def test_a_resumed_start_reads_its_checkpoint_once(tmp_path, monkeypatch):
    cfg = make_cfg(*SMALL, "batch_size=auto", "batch_size_finder.max_batch_size=32", "max_steps=2")
    fit(cfg, tmp_path)
    reads = []
    load = checkpoint_reads.read_state  # the job's parts: config, decisions, position, ...
    monkeypatch.setattr(checkpoint_reads, "read_state", lambda p: reads.append(p) or load(p))
    cfg.max_steps = 4
    summary = fit(cfg, tmp_path).summary
    assert summary["steps"] == 4 and len(reads) == 1
    assert summary["batch_size_finder"]["bound"] == "resumed_checkpoint"


def test_evaluate_builds_no_optimizer_profiler_mfu_or_advice(tmp_path, monkeypatch):
    fit(make_cfg(*SMALL, "max_steps=2"), tmp_path)
    built: list[str] = []

    def recording(name: str, original):
        return lambda *args, **kwargs: built.append(name) or original(*args, **kwargs)

    names = ("build_optimizers", "ProfilerOff", "PerfMeter")  # profile=off: ProfilerOff
    for name in names:
        monkeypatch.setattr(gearshift.build, name, recording(name, getattr(gearshift.build, name)))
    monkeypatch.setattr(
        gearshift.build.MFU, "measure", recording("MFU", gearshift.build.MFU.measure)
    )
    # build_run imports the advisor where advise=true asks for it
    monkeypatch.setattr(config_advice, "advise", recording("advise", config_advice.advise))
    checkpoint = latest_checkpoint(tmp_path / "checkpoints")
    assert evaluate.main([f"resume={checkpoint}", "logger=none", "advise=true"]) == 0
    assert built == []
    # the control: training builds them
    fit(make_cfg(*SMALL, "max_steps=1", "advise=true"), tmp_path / "train")
    assert set(built) == {*names, "MFU", "advise"}


def test_a_checkpoint_written_before_the_whole_record_was_kept_still_gives_its_amp():
    older = Saved(Path("step"), {"decisions": {"amp": {"dtype": "float16", "reason": "why"}}})
    assert older.decisions == {"amp": "float16", "amp_reason": "why"}
    assert Saved(Path("step"), {"config": {}}).decisions == {}  # older still: none kept


def test_the_decisions_are_a_record_no_part_can_change():
    decided = gearshift.build.Gears({"amp": "off", "amp_reason": "amp=off"})
    with pytest.raises(TypeError):
        decided["amp"] = "bfloat16"  # type: ignore[index]
    more = decided | {"compile": "off"}
    assert dict(more) == {"amp": "off", "amp_reason": "amp=off", "compile": "off"}
    assert "compile" not in decided  # `|` made a new record
