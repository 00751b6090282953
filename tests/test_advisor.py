"""The gear advisor: each finding fires on a config with the problem, experiment=fast is clean."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
import torch
import torchvision
from helpers import ROOT, fake_cpu_speed, make_cfg, seconds
from torch import nn

from gearshift.advise import build_on_meta
from gearshift.advise import main as advise_main
from gearshift.config_advice import advise_config
from train import fit

CPU, CUDA = torch.device("cpu"), torch.device("cuda")  # the advisor never touches the device


def finding_ids(*overrides: str, device: torch.device = CPU, model: nn.Module | None = None):
    cfg = make_cfg(*overrides)
    return {f.id for f in advise_config(cfg, model or build_on_meta(cfg), device)}


# (overrides, device the run is for, the finding it must raise)
PROBLEMS = [
    (["batch_size=12"], CPU, "batch-size-multiple-of-8"),
    (["model=mlp", "amp=bf16"], CUDA, "layer-width-multiple-of-8"),  # 10 classes
    (["model=simple_cnn", "amp=fp16", "model.width=12"], CUDA, "layer-width-multiple-of-8"),
    (["model=simple_cnn", "model.conv_bias=true"], CPU, "conv-bias-before-batchnorm"),
    (["data.on_device=false"], CUDA, "loader-no-workers"),
    (["data.on_device=false", "dataloader.num_workers=2"], CUDA, "loader-no-pin-memory"),
    (["model=mlp", "memory_format=channels_last"], CPU, "channels-last-without-conv"),
    (["cudnn_benchmark=true", "data.num_samples=250"], CUDA, "cudnn-benchmark-varying-shapes"),
    (["compile=on", "data.num_samples=250"], CPU, "compile-short-last-batch"),
]


@pytest.mark.parametrize(("overrides", "device", "finding"), PROBLEMS)
def test_each_finding_fires_on_a_config_with_its_problem(overrides, device, finding):
    assert finding in finding_ids(*overrides, device=device)


@pytest.mark.parametrize(("overrides", "device", "finding"), PROBLEMS)
def test_each_finding_stays_silent_once_its_problem_is_fixed(overrides, device, finding):
    fixes = {
        "batch-size-multiple-of-8": ["batch_size=16"],
        "layer-width-multiple-of-8": ["data.num_classes=16", "model.width=16"],
        "conv-bias-before-batchnorm": ["model.conv_bias=false"],
        "loader-no-workers": ["dataloader=tuned"],
        "loader-no-pin-memory": ["dataloader.pin_memory=auto"],
        "channels-last-without-conv": ["memory_format=contiguous"],
        "cudnn-benchmark-varying-shapes": ["dataloader.drop_last=true"],
        "compile-short-last-batch": ["dataloader.drop_last=true"],
    }[finding]
    if finding == "layer-width-multiple-of-8" and "model=mlp" in overrides:
        fixes = ["data.num_classes=16"]
    assert finding not in finding_ids(*overrides, *fixes, device=device)


def test_experiment_fast_is_clean_here_and_for_a_gpu():
    assert finding_ids("experiment=fast") == set()
    # On a GPU bf16 wants 8-wide layers everywhere: the classifier too.
    assert finding_ids("experiment=fast", device=CUDA) == {"layer-width-multiple-of-8"}
    assert finding_ids("experiment=fast", "data.num_classes=16", device=CUDA) == set()
    assert finding_ids("experiment=fast", "model=simple_cnn", "data.num_classes=16") == set()


def test_rules_that_cost_only_on_a_gpu_stay_silent_on_the_cpu(monkeypatch):
    fake_cpu_speed(monkeypatch, 1.4)  # bf16 native: this test is not about its speed
    ids = finding_ids("model=mlp", "amp=bf16", "data.on_device=false", "cudnn_benchmark=true")
    assert ids == set()


def test_amp_bf16_on_a_cpu_where_it_measures_slower_names_the_slowdown_and_the_fix(monkeypatch):
    fake_cpu_speed(monkeypatch, 0.01)  # bf16 emulated, as on an AVX2-only CPU
    [finding] = advise_config(make_cfg("amp=bf16"), build_on_meta(make_cfg()), CPU)
    assert finding.id == "amp-slower-than-fp32"
    assert "amp=bf16" in finding.message
    assert "bf16 measured 100x slower than float32 (matmul 0.01x, conv 0.01x)" in finding.message
    assert finding.fix == "amp=on (which picks float32 on this CPU) or amp=off"
    assert finding_ids("amp=on") == finding_ids("amp=off") == set()  # on: float32 here
    assert "amp-slower-than-fp32" not in finding_ids("amp=bf16", device=CUDA)  # not a CPU
    fake_cpu_speed(monkeypatch, 1.4)
    assert finding_ids("amp=bf16") == set()


def test_conv_bias_before_batchnorm_found_inside_a_resnet_through_fx():
    # torchvision's ResNet keeps conv1 and bn1 as attributes, ordered only by forward()
    model = torchvision.models.resnet18(num_classes=10)
    block = model.layer2[1]
    block.conv1 = nn.Conv2d(128, 128, 3, padding=1, bias=True)
    cfg = make_cfg()
    findings = advise_config(cfg, model, CPU)
    [conv_bias] = [f for f in findings if f.id == "conv-bias-before-batchnorm"]
    assert "'layer2.1.conv1' -> 'layer2.1.bn1'" in conv_bias.message
    assert "1 convolution(s)" in conv_bias.message
    assert "conv-bias-before-batchnorm" not in {
        f.id for f in advise_config(cfg, torchvision.models.resnet18(num_classes=10), CPU)
    }


class Untraceable(nn.Module):
    """Data-dependent control flow: fx cannot trace it, so the advisor walks its Sequentials."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, bias=True), nn.BatchNorm2d(8), nn.ReLU())

    def forward(self, x):
        if x.sum() > 0:
            return self.body(x)
        return self.body(-x)


def test_conv_bias_before_batchnorm_found_without_fx_in_sequential_order():
    [finding] = [
        f for f in advise_config(make_cfg(), Untraceable(), CPU) if f.id.startswith("conv")
    ]
    assert "'body.0' -> 'body.1'" in finding.message


def test_conv_bias_not_flagged_when_the_conv_output_is_used_elsewhere():
    class Branch(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 8, 3, bias=True), nn.BatchNorm2d(8)

        def forward(self, x):
            y = self.conv(x)
            return self.bn(y) + y  # the bias matters on the skip path

    assert "conv-bias-before-batchnorm" not in {
        f.id for f in advise_config(make_cfg(), Branch(), CPU)
    }


def test_checkpointed_models_are_still_traced_for_conv_bias():
    ids = finding_ids("model=simple_cnn", "model.conv_bias=true", "model.checkpointing=true")
    assert "conv-bias-before-batchnorm" in ids


def test_data_parallel_fires_when_the_config_chooses_dp():
    assert "data-parallel" in finding_ids("distributed=dp", device=CUDA)
    for strategy in ("auto", "ddp", "none"):
        assert "data-parallel" not in finding_ids(f"distributed={strategy}", device=CUDA)


def test_data_parallel_fires_on_a_model_wrapped_in_it():
    cfg = make_cfg("model=mlp")
    assert "data-parallel" in {
        f.id for f in advise_config(cfg, nn.DataParallel(build_on_meta(cfg)), CPU)
    }


def test_fit_warns_once_per_finding_and_writes_them_to_the_summary(tmp_path, caplog):
    cfg = make_cfg(
        "model=simple_cnn", "model.conv_bias=true", "batch_size=12", "max_steps=3", "advise=true"
    )
    with caplog.at_level(logging.WARNING, logger="gearshift"):
        result = fit(cfg, tmp_path)
    warned = [r.getMessage() for r in caplog.records if "advisor [" in r.getMessage()]
    assert len(warned) == 2
    assert any("[conv-bias-before-batchnorm]" in w and "bias=False" in w for w in warned)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert [a["id"] for a in written["advice"]] == [
        "batch-size-multiple-of-8",
        "conv-bias-before-batchnorm",
    ]
    assert all(a["message"] and a["fix"] for a in written["advice"])
    assert written["advice"] == result.summary["advice"]


def test_a_run_without_advise_true_neither_warns_nor_lists_advice(tmp_path, caplog):
    cfg = make_cfg("model=simple_cnn", "model.conv_bias=true", "batch_size=12", "max_steps=1")
    with caplog.at_level(logging.WARNING, logger="gearshift"):
        result = fit(cfg, tmp_path)  # the same problems as above, but nobody asked
    assert [r for r in caplog.records if "advisor [" in r.getMessage()] == []
    assert result.summary["advice"] == []


def test_fit_on_experiment_fast_config_has_no_advice(tmp_path):
    cfg = make_cfg(
        "experiment=fast", "compile=off", "model=mlp", "memory_format=contiguous", "advise=true"
    )
    assert fit(cfg, tmp_path).summary["advice"] == []


def test_advise_command_prints_findings_and_exits_0():
    result = subprocess.run(
        [
            *(sys.executable, "-m", "gearshift.advise", "--device", "cuda", "model=simple_cnn"),
            *("model.conv_bias=true", "batch_size=100", "amp=on", "data.on_device=false"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=seconds(120),
    )
    assert result.returncode == 0, result.stderr
    ids = {line[1:].split("]")[0] for line in result.stdout.splitlines() if line.startswith("[")}
    assert ids == {
        "batch-size-multiple-of-8",
        "layer-width-multiple-of-8",
        "conv-bias-before-batchnorm",
        "loader-no-workers",
        "loader-no-pin-memory",
    }
    assert result.stdout.count("    fix: ") == 5


def test_advise_command_rejects_a_bad_value_in_one_line(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # its main(), in this process: the command itself is tested above
    assert advise_main(["batch_size=0"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: batch_size=0 is not allowed; expected an integer >= 1 or auto"
    ]
