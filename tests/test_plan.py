"""plan=on (observe/plan.py): the planned peak against what real steps allocate, the FSDP
shares, the roofline, and the one line for input it cannot plan."""

from __future__ import annotations

import json
import logging
import time
from functools import cache

import pytest
import torch
from helpers import CONF, load_script, make_cfg, run_train, seconds, train_in_process
from test_config import preflight_error_lines

from gearshift.app import preflight
from gearshift.batch_finder import TensorMemory, largest_fitting
from gearshift.engine.optim import build_optimizers, clip_grad_norm
from gearshift.engine.precision import resolve_amp
from gearshift.models.factory import build_model
from gearshift.observe.plan import (
    log_plan,
    make_plan,
    resolve_target,
    same_samples_a_step,
    trace,
)
from gearshift.tasks import build_task
from train import fit

LM = ("experiment=lm", "logger=none", "progress_bar=false", "batch_size=8")
CPU = torch.device("cpu")


def measured_peak(cfg) -> int:
    """Peak tensor bytes of two real optimizer steps as train.py's loop takes them: the
    parameters and buffers, plus every storage the operators allocate, tallied until its
    weakref finalizer fires (batch_finder.py TensorMemory), not by the estimator."""
    torch.manual_seed(0)
    task = build_task(cfg.task)
    fmt = torch.channels_last if cfg.memory_format.channels_last else torch.contiguous_format
    model = build_model(cfg.model, CPU, fmt).train()
    optimizer = build_optimizers(model, cfg.optimizer)
    dtype = resolve_amp(cfg.amp.dtype, CPU).dtype
    held = sum(t.untyped_storage().nbytes() for t in [*model.parameters(), *model.buffers()])
    with TensorMemory() as memory:
        for _ in range(2):
            for _ in range(cfg.accum):
                inputs, targets = task.example_batch(cfg.batch_size, CPU)
                with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                    inputs = inputs.contiguous(memory_format=fmt) if inputs.dim() == 4 else inputs
                    loss, _ = task.loss_terms(model, (inputs, targets))
                (loss / cfg.accum).backward()
            if cfg.optimizer.clip_grad_norm:
                clip_grad_norm(model.parameters(), cfg.optimizer.clip_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=cfg.optimizer.set_to_none)
    return held + memory.peak


def planned_peak(cfg) -> float:
    task = build_task(cfg.task)
    target = resolve_target(cfg)
    dtype = resolve_amp(cfg.amp.dtype, CPU).dtype
    return trace(cfg, task, target, dtype, cfg.batch_size, cfg.accum, timed=False).total


CASES = {
    "mlp": ("model=mlp",),
    "mlp_bf16_accum4_muon": ("model=mlp", "amp=bf16", "accum=4", "optimizer=muon"),
    "resnet18": (),
    "gpt": LM,
    "gpt_checkpointing": (*LM, "model.checkpointing=true"),
}
SLOW_CASES = {
    "resnet18_bf16_accum4": ("amp=bf16", "accum=4", "batch_size=8"),
    "gpt_bf16_muon": (*LM, "amp=bf16", "optimizer=muon"),
    "resnet18_32px": ("data.image_size=32",),
    "resnet18_32px_checkpointing": ("data.image_size=32", "model.checkpointing=true"),
    "resnet18_channels_last_adamw": ("memory_format=channels_last", "optimizer=adamw"),
    "gpt_bf16_checkpointing": (*LM, "amp=bf16", "model.checkpointing=true"),
}


@cache  # the checkpointing test compares two of the cases
def planned_and_measured(case: str) -> tuple[float, int]:
    overrides = {**CASES, **SLOW_CASES}[case]
    cfg = make_cfg("device=cpu", *overrides, tiny=overrides[:1] != LM[:1])
    planned, measured = planned_peak(cfg), measured_peak(cfg)
    print(f"{case}: planned {planned / 2**20:.3f} MiB, measured {measured / 2**20:.3f} MiB, "
          f"ratio {planned / measured:.4f}")  # fmt: skip
    return planned, measured


@pytest.mark.parametrize(
    "case", [*CASES, *(pytest.param(c, marks=pytest.mark.slow) for c in SLOW_CASES)]
)
def test_the_planned_peak_is_within_10_percent_of_what_real_steps_allocate(case):
    planned, measured = planned_and_measured(case)
    assert planned == pytest.approx(measured, rel=0.10)


def test_activation_checkpointing_lowers_the_planned_peak_as_much_as_the_measured_one():
    planned, measured = planned_and_measured("gpt")
    planned_ac, measured_ac = planned_and_measured("gpt_checkpointing")
    assert measured - measured_ac > 0.2 * measured  # the GPT's activations dominate its peak
    assert planned - planned_ac == pytest.approx(measured - measured_ac, rel=0.10)


def test_fsdp_on_8_ranks_holds_an_eighth_of_the_parameters_gradients_and_optimizer_state():
    one = make_plan(make_cfg("model=mlp", "optimizer=adamw", "plan.device=h100"))
    eight = make_plan(
        make_cfg("model=mlp", "optimizer=adamw", "plan.device=h100", "plan.world_size=8",
                 "distributed=fsdp")
    )  # fmt: skip
    assert (one.strategy, eight.strategy, eight.world_size) == ("none", "fsdp", 8)
    for key in ("parameters", "gradients", "optimizer_state"):
        assert eight.memory[key] == pytest.approx(one.memory[key] / 8)
    assert eight.memory["activations"] == one.memory["activations"]  # the batch is per device
    assert eight.batch_size == one.batch_size == 16
    assert eight.samples_per_sec == pytest.approx(8 * eight.samples_per_sec_per_device)
    assert one.fits and one.advice == []


def test_the_roofline_is_bound_by_the_device_and_the_largest_batch_fills_the_headroom():
    cfg = make_cfg("model=mlp", "plan.device=h100", "plan.headroom=0.2")
    h100, t4 = make_plan(cfg), make_plan(make_cfg("model=mlp", "plan.device=t4"))
    assert 0 < h100.step_time_s < t4.step_time_s  # T4: 8 TFLOP/s float32 against 67
    assert h100.flops_per_step > 0 and h100.bytes_per_step > 0
    largest = h100.largest_batch_size
    assert largest % 8 == 0 and largest > 10_000
    at = make_plan(
        make_cfg("model=mlp", "plan.device=h100", "plan.headroom=0.2", f"batch_size={largest}")
    )
    above = make_plan(
        make_cfg(
            "model=mlp", "plan.device=h100", "plan.headroom=0.2", f"batch_size={largest * 21 // 20}"
        )
    )
    assert at.fits and not above.fits  # the largest is within 5% of the edge


def test_a_batch_too_large_for_the_device_names_the_memory_gears_not_on():
    plan = make_plan(make_cfg(*LM[:2], "batch_size=65536", "plan.device=t4", tiny=False))
    assert not plan.fits and plan.largest_batch_size < 65536
    assert [gear.split(" ")[0] for gear in plan.advice[:3]] == [
        "model.checkpointing=true", "amp=bf16", "distributed=fsdp",
    ]  # fmt: skip
    batch, accum = split_of(plan.advice[3])
    assert batch * accum == 65536 and batch <= plan.largest_batch_size  # the samples a step


def split_of(gear: str) -> tuple[int, int]:
    """(N, M) of the advice `batch_size=N accum=M (...)`."""
    batch, accum = (int(part.split("=")[1]) for part in gear.split(" ")[:2])
    return batch, accum


@pytest.mark.parametrize(
    ("samples", "largest", "batch", "accum"),
    [(64, 56, 32, 2), (64, 16, 16, 4), (96, 56, 48, 2), (64, 7, 4, 16), (62, 56, 31, 2)],
)
def test_the_batch_advice_keeps_the_samples_a_step_exactly(samples, largest, batch, accum):
    gear = same_samples_a_step(samples, largest)
    assert split_of(gear) == (batch, accum)
    assert gear == f"batch_size={batch} accum={accum} (the same {samples} samples a step)"


def test_samples_a_step_that_no_batch_near_the_largest_splits_are_said_so():
    # 61 is prime: only batch 1 x accum 61 would keep it, far below the 56 that fit
    assert same_samples_a_step(61, 56) == (
        "batch_size<=56 (no batch from 28 to 56 times an accum makes the 61 samples a step)"
    )


def test_batch_64_where_56_fit_is_advised_as_32_x_2_not_56_x_2():
    # the case (GPT-2 at batch 64 on an H100: 56 fit, and 56 x 2 = 112 was advised),
    # on the MLP with the memory budget batch 60's peak, so that 56 is the largest that fits
    at_60 = make_plan(make_cfg("model=mlp", "batch_size=60", "plan.device=h100"))
    cfg = make_cfg("model=mlp", "batch_size=64", "plan.device=h100")
    plan = make_plan(cfg, budget=at_60.peak_bytes)
    assert not plan.fits and plan.largest_batch_size == 56
    assert plan.advice[-1] == "batch_size=32 accum=2 (the same 64 samples a step)"


class ItemModel(torch.nn.Module):
    """A model whose forward reads a value on the host: fake tensors have none."""

    def __init__(self, **_: object) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16 * 16 * 3, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = 1.0 if x.sum().item() > 0 else 2.0
        return self.linear(x.flatten(1)) * scale


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("plan.device=b200", "plan.device='b200' is not allowed; choose one of: auto, cpu, h200, "
         "h200_nvl, h100, h100_nvl, h100_pcie, a100, l40s, l4, a10, v100, t4"),
        ("plan.world_size=0", "plan.world_size=0 is not allowed; expected an integer >= 1 (or "
         "null to turn it off)"),
        ("plan.headroom=1.5", "plan.headroom=1.5 is not allowed; expected a share of the memory, "
         "0 <= headroom < 1"),
        ("model._target_=test_plan.ItemModel", "model._target_=test_plan.ItemModel is not "
         "allowed; plan=on runs it under fake tensors, and operator "
         "aten._local_scalar_dense.default (DataDependentOutputException) cannot run there: "
         "plan without it"),
    ],
)  # fmt: skip
def test_input_it_cannot_plan_is_one_line_exit_2(tmp_path, monkeypatch, capsys, override, message):
    lines = preflight_error_lines(tmp_path, monkeypatch, capsys, f"plan=on {override} logger=none")
    assert lines == [f"error: {message}"]


def test_plan_on_prints_the_split_and_exits_0_with_no_run_folder(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.INFO)
    with pytest.raises(SystemExit) as exit:
        preflight(CONF, argv=["plan=on", "model=mlp", "logger=none", "plan.device=a100"])
    assert exit.value.code == 0
    assert list(tmp_path.iterdir()) == []
    text = caplog.text
    assert "plan: A100 x 1 (none), batch 64" in text
    for key in ("parameters", "gradients", "optimizer_state", "activations", "temporaries"):
        assert f"{key} " in text
    assert "samples/s per device" in text


def test_plan_on_plans_fsdp_on_8_ranks_from_one_process(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.INFO)
    argv = ["plan=on", "model=mlp", "logger=none", "plan.device=h100", "plan.world_size=8"]
    with pytest.raises(SystemExit) as exit:
        preflight(CONF, argv=[*argv, "distributed=fsdp"])
    assert exit.value.code == 0 and "plan: H100 x 8 (fsdp)" in caplog.text
    assert list(tmp_path.iterdir()) == []


def test_train_py_plan_on_prints_the_split_and_exits_0_with_no_run_folder(tmp_path):
    result = run_train("plan=on", "model=mlp", "logger=none", cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    text = result.stdout + result.stderr
    assert "plan: cpu x 1 (none), batch 64 x accum 1 per device" in text
    for key in ("parameters", "gradients", "optimizer_state", "activations", "temporaries"):
        assert f"{key} " in text
    assert "by the roofline (a lower bound)" in text
    assert list(tmp_path.iterdir()) == []  # no runs/, no outputs/


def test_train_py_plan_on_with_a_device_out_of_the_table_is_one_error_line_exit_2(tmp_path):
    result = train_in_process("plan=on", "plan.device=b200", "logger=none", cwd=tmp_path)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: plan.device='b200' is not allowed; choose one of: auto, cpu, h200, h200_nvl, "
        "h100, h100_nvl, h100_pcie, a100, l40s, l4, a10, v100, t4"
    ]
    assert "error:" not in result.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_gpt2_124m_at_16_x_1024_on_h100_and_on_8_ranks_under_fsdp(tmp_path, monkeypatch, caplog):
    gpt2 = (*LM[:2], "model=gpt2", "data.vocab_size=50257", "batch_size=16", "plan.device=h100")
    start = time.perf_counter()
    one = make_plan(make_cfg(*gpt2, tiny=False))
    took = time.perf_counter() - start
    params = one.memory["parameters"] / 4  # float32
    assert 123e6 < params < 125e6 + 50304 * 768, params  # 124M, the head padded to 50304
    log_plan(one)
    eight = make_plan(make_cfg(*gpt2, "plan.world_size=8", "distributed=fsdp", tiny=False))
    for key in ("parameters", "optimizer_state"):
        assert eight.memory[key] == pytest.approx(one.memory[key] / 8)
    print(f"GPT-2 124M, 16 x 1024 on h100: planned {one.peak_bytes / 2**30:.2f} GiB, "
          f"{one.step_time_s * 1e3:.0f} ms a step; x8 fsdp {eight.peak_bytes / 2**30:.2f} GiB; "
          f"planned in {took:.1f} s")  # fmt: skip
    assert took < seconds(60)


def test_plan_check_puts_the_plan_beside_the_measured_peak_and_step_time(tmp_path, capsys):
    cfg = make_cfg("model=mlp", "device=cpu", "max_steps=3", "plan.check=true", "epochs=1")
    summary = fit(cfg, tmp_path).summary
    check = summary["plan"]
    assert check["measured_peak_kind"] == "tensor_bytes_of_a_real_step"
    assert check["peak_ratio"] == pytest.approx(1, abs=0.10)
    assert check["predicted_step_time_s"] > 0 and check["step_time_ratio"] > 0
    print(f"plan.check on a tiny mlp run: peak ratio {check['peak_ratio']:.4f}, step time "
          f"ratio {check['step_time_ratio']:.3f}, planning took {check['plan_seconds']:.2f} s")  # fmt: skip
    assert json.loads((tmp_path / "summary.json").read_text())["plan"] == check
    off = fit(make_cfg("model=mlp", "device=cpu", "max_steps=1"), tmp_path / "off").summary
    assert off["plan"] is None
    # scripts/gpu_check.sh's tables over these runs, one that left nothing among them
    tables = load_script("gpu_summaries")
    capsys.readouterr()
    tables.plan_table(tmp_path, tmp_path / "lost")
    tables.images_table(tmp_path, tmp_path, tmp_path / "off")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{tmp_path.name:<10} peak planned ")
    assert lines[0].endswith(f"ratio {check['peak_ratio']:.3f} ok")
    assert f"ratio {check['step_time_ratio']:.3f}" in lines[1]
    assert lines[2] == "lost       failed (no summary.json)"
    assert lines[3].endswith("1.00x synthetic") and lines[4].startswith("off ")


@pytest.mark.slow  # 12 s: real steps up to 512 samples
def test_batch_size_auto_from_the_planned_batch_takes_fewer_real_trials():
    cfg = make_cfg("model=mlp", "device=cpu")
    budget = 11 * 2**20  # 9 MiB at 16 samples, and room for about 200 more
    plan = make_plan(cfg, budget=budget)
    tried: dict[str, list[int]] = {"doubling": [], "planned": []}

    def fits_for(name: str):
        def fits(n: int) -> bool:  # a real trial: two steps at n, tallied
            tried[name].append(n)
            return measured_peak(make_cfg("model=mlp", "device=cpu", f"batch_size={n}")) <= budget

        return fits

    doubling = largest_fitting(fits_for("doubling"), 4096)
    planned = largest_fitting(fits_for("planned"), 4096, start=plan.largest_batch_size)
    print(f"batch_size=auto trials: {tried}")
    assert planned == doubling and abs(plan.largest_batch_size - planned) <= 8
    assert len(tried["planned"]) < len(tried["doubling"])


@pytest.mark.parametrize("limit", [100, 300, 1000, 3000])
@pytest.mark.parametrize("error", [-0.1, -0.03, 0.0, 0.03, 0.1])
def test_a_start_near_the_answer_takes_fewer_trials_than_doubling(limit, error):
    counts = []
    for start in (None, int(limit * (1 + error))):
        tried = []
        found = largest_fitting(lambda n, t=tried: t.append(n) or n <= limit, 4096, start=start)
        assert found == limit // 8 * 8
        counts.append(len(tried))
    assert counts[1] < counts[0], counts
