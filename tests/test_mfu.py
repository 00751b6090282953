"""MFU: FLOPs per sample counted once, the device's peak, and figures that agree."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import make_cfg, task_of

import train as loop
from gearshift import build
from gearshift.engine.precision import Precision
from gearshift.models.factory import build_model
from gearshift.observe.gpu_datasheets import gpu_peak
from gearshift.observe.logger_backend import NullLogger
from gearshift.observe.mfu import compute_dtype, count_flops_per_sample

CPU = torch.device("cpu")


class RecordingLogger(NullLogger):
    def __init__(self) -> None:
        self.logged: list[tuple[int, dict]] = []

    def log(self, metrics, step):
        self.logged.append((step, dict(metrics)))


def test_summary_reports_mfu_against_the_measured_cpu_peak(tmp_path, monkeypatch):
    recorder = RecordingLogger()
    monkeypatch.setattr(loop, "build_logger", lambda *args, **kwargs: recorder)
    cfg = make_cfg("model=mlp", "max_steps=12", "log_every_n_steps=4", "warmup_steps=4")
    result = loop.fit(cfg, tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == json.loads(json.dumps(result.summary))

    assert summary["peak_flops_source"].startswith("measured: float32 matmul")
    # a timed rate: no floor a busy machine could miss (a loaded 2-core runner measured 0.65e9)
    assert math.isfinite(summary["peak_flops_per_sec"]) and summary["peak_flops_per_sec"] > 0
    assert summary["achieved_flops_per_sec"] == pytest.approx(
        summary["flops_per_sample"] * summary["samples_per_sec_per_device"]
    )
    assert summary["mfu"] == pytest.approx(
        summary["achieved_flops_per_sec"] / summary["peak_flops_per_sec"]
    )
    # the peak is timed once, at start: a busier machine then than during the steps gives an
    # MFU above 1, reported as it is and flagged
    assert summary["mfu"] > 0 and summary["peak_flops_beaten"] == (summary["mfu"] > 1)
    assert summary["batch_size_finder"] is None and summary["gears"]["batch_size"] == 16

    steps = [step for step, metrics in recorder.logged if "perf/samples_per_sec" in metrics]
    assert steps == [4, 8, 12]  # perf/mfu at every log step, from that interval's samples/s
    for _, metrics in recorder.logged:
        if "perf/samples_per_sec" in metrics:
            assert metrics["perf/mfu"] == pytest.approx(
                summary["flops_per_sample"]
                * metrics["perf/samples_per_sec"]
                / summary["peak_flops_per_sec"]
            )


def test_a_run_that_beat_the_peak_says_so_and_its_mfu_is_not_clamped():
    measured = "measured: float32 matmul 1024x1024 on 2 CPU threads"
    mfu = build.MFU(flops_per_sample=1e6, peak_flops_per_sec=1e9, peak_flops_source=measured)
    below = mfu.summary(500.0)
    assert below["mfu"] == 0.5 and below["peak_flops_beaten"] is False
    above = mfu.summary(1500.0)
    assert above["mfu"] == 1.5 and above["peak_flops_beaten"] is True
    assert above["achieved_flops_per_sec"] == 1.5e9 and above["peak_flops_per_sec"] == 1e9
    unknown = build.MFU(1e6, None, "unknown device 'X': no peak in the table").summary(1500.0)
    assert unknown["mfu"] is None and unknown["peak_flops_beaten"] is None


def test_flops_per_sample_of_the_mlp_match_its_matmuls():
    cfg = make_cfg("model=mlp")  # 768 -> 512 -> 512 -> 10 on 3x16x16 images
    model = build_model(cfg.model, CPU, torch.contiguous_format)
    layers = [(768, 512), (512, 512), (512, 10)]
    forward = sum(2 * i * o for i, o in layers)
    weight_grads = forward
    input_grads = sum(2 * i * o for i, o in layers[1:])  # the images need no gradient
    want = forward + weight_grads + input_grads
    got = count_flops_per_sample(
        model, task_of(cfg), CPU, Precision(None, CPU), torch.contiguous_format
    )
    assert got == want


def test_counting_flops_leaves_the_model_and_the_random_stream_alone():
    cfg = make_cfg("model=simple_cnn")
    model = build_model(cfg.model, CPU, torch.contiguous_format)
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    state = torch.random.get_rng_state()
    build.MFU.measure(
        model, task_of(cfg), "highest", CPU, Precision(None, CPU), torch.contiguous_format
    )
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(b, buffers[n]) for n, b in model.named_buffers())
    assert torch.equal(torch.random.get_rng_state(), state)


def test_activation_checkpointing_recomputation_is_not_counted():
    counts = []
    for checkpointing in ("false", "true"):
        cfg = make_cfg("model=resnet18", f"model.checkpointing={checkpointing}")
        model = build_model(cfg.model, CPU, torch.contiguous_format)
        counts.append(
            count_flops_per_sample(
                model, task_of(cfg), CPU, Precision(None, CPU), torch.contiguous_format
            )
        )
    assert counts[0] == counts[1] > 0


@pytest.mark.parametrize(
    ("name", "dtype", "tflops", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "bfloat16", 989.5, "H100"),
        ("NVIDIA H100 PCIe", "bfloat16", 756.5, "H100 PCIe"),
        ("NVIDIA H100 NVL", "float16", 835.5, "H100 NVL"),
        ("NVIDIA H200", "tf32", 494.5, "H200"),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156, "A100"),
        ("NVIDIA A100-PCIE-40GB", "float32", 19.5, "A100"),
        ("NVIDIA L4", "bfloat16", 121, "L4"),
        ("NVIDIA L40S", "bfloat16", 362.05, "L40S"),
        ("NVIDIA A10", "float16", 125, "A10"),
        ("Tesla T4", "float16", 65, "T4"),
    ],
)
def test_gpu_peak_table_matches_the_device_name_and_dtype(name, dtype, tflops, model):
    peak, source = gpu_peak(name, dtype)
    assert peak == tflops * 1e12
    assert source.startswith(f"datasheet: {model} dense {dtype}")


def test_gpu_peak_is_unknown_for_an_unlisted_device_or_dtype():
    assert gpu_peak("NVIDIA A10G", "bfloat16")[0] is None  # not A10, not A100
    assert gpu_peak("Tesla T4", "bfloat16")[0] is None  # no bf16 hardware
    assert gpu_peak("Some Future GPU", "float32") == (
        None,
        "unknown device 'Some Future GPU': no peak in the table",
    )


def test_compute_dtype_follows_autocast():
    model = torch.nn.Linear(2, 2)
    assert compute_dtype(Precision(torch.bfloat16, CPU), CPU, model) == "bfloat16"
    assert compute_dtype(Precision(None, CPU), CPU, model) == "float32"


def test_bf16_run_is_measured_against_the_bf16_peak(tmp_path):
    summary = loop.fit(make_cfg("model=mlp", "amp=bf16", "max_steps=6"), tmp_path).summary
    assert summary["peak_flops_source"].startswith("measured: bfloat16 matmul")
    assert math.isfinite(summary["mfu"]) and summary["mfu"] > 0
