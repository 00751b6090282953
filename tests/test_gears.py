"""Each gear acts: dtypes, strides, optimizer steps, gradients, worker processes, freed grads."""

from __future__ import annotations

import logging
import math
import os
import time

import pytest
import torch
from helpers import ForwardRecorder, StepCounter, fake_cpu_speed, make_cfg
from torch import nn

from gearshift.data.host_loader import build_loader, loader_workers
from gearshift.engine import cpu_probe, precision
from gearshift.engine.optim import Optimizers
from gearshift.engine.precision import Precision, resolve_amp
from train import fit

CPU = torch.device("cpu")


def test_amp_bf16_runs_the_forward_in_bfloat16(tmp_path):
    with ForwardRecorder(nn.Linear) as seen:
        result = fit(make_cfg("model=mlp", "amp=bf16", "max_steps=2"), tmp_path)
    assert {out.dtype for _, _, out, _ in seen.training()} == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in result.model.parameters())  # master weights
    assert result.summary["gears"]["amp"] == "bfloat16"


def test_amp_off_stays_float32(tmp_path):
    with ForwardRecorder(nn.Linear) as seen:
        fit(make_cfg("model=mlp", "max_steps=2"), tmp_path)
    assert {out.dtype for _, _, out, _ in seen.training()} == {torch.float32}


def test_amp_on_picks_bf16_on_a_cpu_where_it_measures_fast_without_a_scaler(monkeypatch):
    fake_cpu_speed(monkeypatch, 1.4)  # native bf16, as on this CPU (AVX512_BF16)
    choice = resolve_amp("auto", CPU)
    assert choice.dtype == torch.bfloat16
    assert choice.reason.startswith("bf16: measured 1.4x float32 (matmul 1.4x, conv 1.4x)")
    assert not Precision(torch.bfloat16, CPU).scaler.is_enabled()
    assert Precision(torch.float16, CPU).scaler.is_enabled()


def test_amp_on_stays_float32_on_a_cpu_that_emulates_bf16_and_fp16(monkeypatch):
    fake_cpu_speed(monkeypatch, 0.01)  # an AVX2-only CPU: 100x slower than float32
    monkeypatch.setattr(cpu_probe, "native_kernels", lambda dtype: False)
    choice = resolve_amp("auto", CPU)
    assert choice.dtype is None and precision.amp_name(choice.dtype) == "off"
    assert choice.reason.startswith("float32: bf16 measured 100x slower than float32")
    assert choice.reason.endswith("; fp16: no native kernels reported, not measured")


def test_amp_on_tolerates_probe_noise_but_not_a_real_slowdown(monkeypatch):
    fake_cpu_speed(monkeypatch, 0.95)  # within 10% of float32: noise, bf16 stays
    assert resolve_amp("auto", CPU).dtype == torch.bfloat16
    fake_cpu_speed(monkeypatch, 0.8)
    assert resolve_amp("auto", CPU).dtype is None


@pytest.mark.parametrize("fp16_speed", [1.3, 0.5])
def test_amp_on_takes_native_fp16_where_bf16_is_slow_if_it_measures_fast(monkeypatch, fp16_speed):
    speeds = {torch.bfloat16: 0.02, torch.float16: fp16_speed}  # an ARM CPU without bf16
    monkeypatch.setattr(
        cpu_probe,
        "cpu_speed",
        lambda dtype: cpu_probe.CpuSpeed(dtype, speeds[dtype], speeds[dtype]),
    )
    monkeypatch.setattr(cpu_probe, "native_kernels", lambda dtype: dtype == torch.float16)
    choice = resolve_amp("auto", CPU)
    if fp16_speed > 1:
        assert choice.dtype == torch.float16 and choice.reason.startswith("fp16: measured 1.3x")
    else:
        assert choice.dtype is None and "fp16 measured 2x slower than float32" in choice.reason


@pytest.mark.parametrize("bf16", [True, False])
def test_amp_on_on_cuda_is_bf16_where_supported_else_fp16(monkeypatch, bf16):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: bf16)
    choice = resolve_amp("auto", torch.device("cuda"))  # a decision only: no device touched
    assert choice.dtype == (torch.bfloat16 if bf16 else torch.float16)
    assert choice.reason == (
        "bf16: this GPU supports it" if bf16 else "fp16 with a GradScaler: this GPU has no bf16"
    )


def test_explicit_amp_dtypes_are_forced_whatever_the_probe_says(monkeypatch):
    fake_cpu_speed(monkeypatch, 0.01)
    assert resolve_amp("bfloat16", CPU) == precision.AmpChoice(
        torch.bfloat16, "bf16: forced by amp=bf16"
    )
    assert resolve_amp("float16", CPU).dtype == torch.float16
    assert resolve_amp("none", CPU) == precision.AmpChoice(None, "float32: amp=off")


@pytest.mark.parametrize("preset", [("amp=on",), ("experiment=fast", "compile=off")])
def test_amp_on_trains_in_float32_where_bf16_is_slow_and_says_why(
    tmp_path, monkeypatch, caplog, preset
):
    fake_cpu_speed(monkeypatch, 0.01)
    cfg = make_cfg("model=simple_cnn", "max_steps=2", *preset)
    with ForwardRecorder(nn.Conv2d) as seen, caplog.at_level(logging.INFO, logger="gearshift"):
        gears = fit(cfg, tmp_path).summary["gears"]
    assert {out.dtype for _, _, out, _ in seen.training()} == {torch.float32}
    assert gears["amp"] == "off" and gears["grad_scaler"] is False
    assert "bf16 measured 100x slower than float32" in gears["amp_reason"]
    assert any(gears["amp_reason"] in r.getMessage() for r in caplog.records)


def test_the_cpu_probe_measures_ratios_once_per_process(monkeypatch):
    timed = []
    real = cpu_probe._fastest_seconds

    def counted(op, **limits):
        timed.append(op)
        return real(op, **limits)

    monkeypatch.setattr(cpu_probe, "_fastest_seconds", counted)
    cpu_probe._float32_seconds.cache_clear()
    cpu_probe.cpu_speed.cache_clear()
    speed = cpu_probe.cpu_speed(torch.bfloat16)
    assert len(timed) == 4  # a matmul and a conv, in float32 and in bf16
    for ratio in (speed.matmul, speed.conv):
        assert math.isfinite(ratio) and ratio > 0
    assert cpu_probe.cpu_speed(torch.bfloat16) is speed and len(timed) == 4  # cached
    cpu_probe.cpu_speed(torch.float16)
    assert len(timed) == 6  # float32 is timed once for both


def test_the_probe_keeps_a_reps_fastest_and_stops_timing_an_op_that_is_conclusively_slow():
    def op_taking(*seconds):
        pauses = iter(seconds)
        calls = []

        def op():
            calls.append(1)
            time.sleep(next(pauses))

        return op, calls

    # interference (a lost time slice) only slows a rep down: the fastest rep is the op
    interfered, calls = op_taking(0, 0.03, 0.001, 0.03, *[0.03] * 7)
    assert cpu_probe._fastest_seconds(interfered) < 0.02 and len(calls) == 11
    # an emulated dtype's op: three reps past the limit are enough
    emulated, calls = op_taking(*[0.025] * 11)
    assert cpu_probe._fastest_seconds(emulated, give_up_s=0.02) >= 0.025 and len(calls) == 4


def test_fp16_grad_scaler_skips_a_step_with_inf_gradients_and_counts_it():
    model = nn.Linear(4, 2)
    optimizers = Optimizers(model, [torch.optim.SGD(model.parameters(), lr=0.1)])
    precision = Precision(torch.float16, torch.device("cpu"))
    before = model.weight.detach().clone()

    with precision.autocast():
        out = model(torch.randn(3, 4))
    assert out.dtype == torch.float16
    precision.backward(out.float().sum() * float("inf"))
    scale = precision.scaler.get_scale()
    precision.step(optimizers)
    assert torch.equal(model.weight, before)  # the step was skipped
    assert int(precision.skipped_steps) == 1 and precision.scaler.get_scale() == scale / 2

    optimizers.zero_grad()
    with precision.autocast():
        precision.backward(model(torch.randn(3, 4)).float().mean() * 1e-2)  # no fp16 overflow
    precision.step(optimizers)
    assert not torch.equal(model.weight, before)  # a finite step goes through
    assert int(precision.skipped_steps) == 1


def test_fp16_training_end_to_end_reports_the_scale(tmp_path):
    result = fit(make_cfg("model=mlp", "amp=fp16", "max_steps=4"), tmp_path)
    assert result.summary["gears"]["grad_scaler"] is True
    assert result.summary["final_loss"] < 10


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_memory_format_sets_the_strides_of_conv_weights_and_inputs(tmp_path, layout):
    with ForwardRecorder(nn.Conv2d) as seen:
        fit(make_cfg("model=simple_cnn", f"memory_format={layout}", "max_steps=2"), tmp_path)
    calls = seen.training()
    _, images, _, _ = calls[0]
    want = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    assert images.is_contiguous(memory_format=want)
    assert all(c[0].weight.is_contiguous(memory_format=want) for c in calls)
    if layout == "channels_last":
        assert not images.is_contiguous()  # really NHWC, not both at once


def test_accum_steps_once_per_window_and_the_short_last_window_steps(tmp_path):
    # 80 samples / batch 8 = 10 micro-batches per epoch: windows of 4, 4 and 2.
    cfg = make_cfg("model=mlp", "data.num_samples=80", "batch_size=8", "accum=4", "epochs=1")
    with StepCounter() as steps:
        result = fit(cfg, tmp_path)
    assert steps.count == 3
    assert result.summary["steps"] == 3 and result.summary["samples"] == 80


def _one_step(tmp_path, batch_size, accum):
    cfg = make_cfg(
        "model=mlp",
        f"batch_size={batch_size}",
        f"accum={accum}",
        "max_steps=1",
        "optimizer.lr=0.5",
        "optimizer.momentum=0",
        "optimizer.weight_decay=0",
        "optimizer.schedule=constant",
    )
    return fit(cfg, tmp_path / f"b{batch_size}").model


def test_accum_4_of_batch_8_equals_accum_1_of_batch_32(tmp_path):
    for d in ("b8", "b32"):
        (tmp_path / d).mkdir()
    accumulated = _one_step(tmp_path, batch_size=8, accum=4)
    whole = _one_step(tmp_path, batch_size=32, accum=1)
    torch.manual_seed(0)  # the initial weights both runs started from
    initial = make_initial_mlp()
    moved = [
        not torch.equal(a, b) for a, b in zip(whole.parameters(), initial.parameters(), strict=True)
    ]
    assert all(moved)
    for a, b in zip(accumulated.parameters(), whole.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def make_initial_mlp():
    from gearshift.models import MLP

    return MLP(in_shape=[3, 16, 16], num_classes=10)


def test_set_to_none_frees_gradients_after_the_step(tmp_path):
    freed = fit(make_cfg("model=mlp", "max_steps=2", "optimizer.set_to_none=true"), tmp_path / "a")
    assert all(p.grad is None for p in freed.model.parameters())
    zeroed = fit(
        make_cfg("model=mlp", "max_steps=2", "optimizer.set_to_none=false"), tmp_path / "b"
    )
    assert all(p.grad is not None and not p.grad.any() for p in zeroed.model.parameters())


class PidLabels(torch.utils.data.Dataset):
    """Labels each sample with the process that loaded it."""

    def __len__(self):
        return 64

    def __getitem__(self, index):
        return torch.zeros(3, 4, 4), os.getpid()


def test_dataloader_tuned_loads_in_worker_processes():
    cfg = make_cfg("dataloader=tuned", "dataloader.num_workers=2")
    loader = build_loader(PidLabels(), cfg.dataloader, cfg.batch_size, CPU, train=True, seed=0)
    pids = {int(pid) for _, labels in loader for pid in labels}
    assert os.getpid() not in pids and len(pids) >= 1
    assert loader.loader.num_workers == 2


@pytest.mark.parametrize(
    ("cpus", "threads", "ranks", "cpu_workers"),
    [(2, 2, 1, 0), (8, 6, 1, 2), (64, 32, 1, 4), (16, 4, 2, 4), (16, 8, 2, 0)],
)
def test_auto_workers_on_a_cpu_take_only_the_cores_compute_leaves_free(
    monkeypatch, cpus, threads, ranks, cpu_workers
):
    monkeypatch.setattr("gearshift.data.host_loader.cpu_count", lambda: cpus)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(ranks))
    workers, reason = loader_workers("auto", CPU)
    assert workers == cpu_workers
    assert f"{threads * ranks} compute thread(s) on {cpus} CPUs" in reason
    assert loader_workers("auto", torch.device("cuda")) == (
        min(4, cpus),
        f"auto: 4 per device, capped by the {cpus} CPUs",
    )
    assert loader_workers(3, CPU) == (3, "dataloader.num_workers=3")


def test_dataloader_baseline_loads_in_this_process():
    cfg = make_cfg()
    loader = build_loader(PidLabels(), cfg.dataloader, cfg.batch_size, CPU, train=True, seed=0)
    assert {int(pid) for _, labels in loader for pid in labels} == {os.getpid()}


def test_host_data_trains_through_tuned_loader(tmp_path):
    cfg = make_cfg(
        *("model=mlp", "data.on_device=false", "dataloader=tuned", "dataloader.num_workers=1"),
        "max_steps=6",
    )
    result = fit(cfg, tmp_path)
    assert result.summary["gears"]["num_workers"] == 1
    assert result.summary["steps"] == 6


def test_validation_runs_under_inference_mode(tmp_path):
    with ForwardRecorder(nn.Linear) as seen:
        result = fit(make_cfg("model=mlp", "max_steps=2"), tmp_path)
    evals = seen.evaluation()
    assert evals and all(inference for *_, inference in evals)
    assert not any(inference for *_, inference in seen.training())
    assert 0.0 <= result.summary["val_accuracy"] <= 1.0


def test_backend_switches_are_set_for_the_run(tmp_path):
    fit(
        make_cfg("model=mlp", "max_steps=1", "cudnn_benchmark=true", "matmul_precision=high"),
        tmp_path,
    )
    assert torch.backends.cudnn.benchmark is True
    assert torch.get_float32_matmul_precision() == "high"


def test_fused_optimizer_gear_builds_a_fused_optimizer(tmp_path):
    result = fit(
        make_cfg("model=mlp", "max_steps=2", "optimizer=adamw", "optimizer.fused=true"), tmp_path
    )
    assert all(group["fused"] for group in result.optimizers.param_groups)
    assert result.summary["steps"] == 2


@pytest.mark.slow
def test_compile_on_trains_through_a_compiled_module(tmp_path):
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    result = fit(make_cfg("model=mlp", "compile=on", "max_steps=3"), tmp_path)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1
    assert result.summary["gears"]["compile"] == "default"
    assert result.summary["steps"] == 3


def test_compile_auto_compiles_on_cuda_only():
    from gearshift.models.factory import resolve_compile

    assert resolve_compile("auto", torch.device("cuda"))[0] is True
    on_cpu, reason = resolve_compile("auto", CPU)
    assert on_cpu is False and "0.8x eager" in reason
    assert resolve_compile(True, CPU) == (True, "compile.enabled=true")


def test_experiment_fast_on_a_cpu_leaves_compile_off_and_says_why(tmp_path, monkeypatch):
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda model, **options: compiled.append(model) or model)
    cfg = make_cfg("experiment=fast", "model=mlp", "max_steps=2", "amp=off")
    gears = fit(cfg, tmp_path / "fast").summary["gears"]
    assert compiled == [] and gears["compile"] == "off"
    assert gears["compile_reason"].startswith("auto: off on cpu")
    fit(make_cfg("compile=on", "model=mlp", "max_steps=2"), tmp_path / "on")
    assert len(compiled) == 1  # compile=on still compiles on a CPU when asked
