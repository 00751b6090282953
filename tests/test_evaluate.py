"""python -m gearshift.evaluate: a checkpoint's validation without training."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import ROOT, make_cfg, seconds

from gearshift import evaluate
from gearshift.state.checkpoint_folders import latest_checkpoint
from train import fit

# amp=bf16 and channels_last: the checkpoint's gears must act again for the figures to match
GEARS = ("model=simple_cnn", "model.width=8", "data.image_size=8", "max_steps=4")
RUN = (*GEARS, "amp=bf16", "memory_format=channels_last", "ema.decay=0.5")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    return run_dir, fit(make_cfg(*RUN, "data.num_val_samples=48"), run_dir).summary


def test_evaluate_reproduces_the_runs_final_validation_exactly(trained):
    run_dir, summary = trained
    checkpoint = latest_checkpoint(run_dir / "checkpoints")
    assert evaluate.main([f"resume={checkpoint}", "logger=none"]) == 0
    result = json.loads((run_dir / "eval.json").read_text())
    assert result["step"] == 4 and result["checkpoint"] == str(checkpoint.resolve())
    assert result["metrics"] == {k: summary[k] for k in ("val_loss", "val_accuracy")}
    assert result["ema_metrics"] == {k: summary["ema"][k] for k in ("val_loss", "val_accuracy")}
    assert result["gears"]["amp"] == summary["gears"]["amp"] == "bfloat16"
    assert result["gears"]["memory_format"] == "channels_last"


def test_overrides_act_on_the_checkpoints_config(trained, tmp_path):
    run_dir, summary = trained
    checkpoint = latest_checkpoint(run_dir / "checkpoints")
    output = tmp_path / "fp32.json"
    args = [f"--output={output}", f"resume={checkpoint}", "amp=off", "data.num_val_samples=16"]
    assert evaluate.main(args) == 0
    result = json.loads(output.read_text())
    assert result["gears"]["amp"] == "off"  # the amp node replaced; the model kept
    assert result["metrics"]["val_loss"] != summary["val_loss"]  # 16 samples, in float32


@pytest.mark.parametrize(
    ("override", "start"),
    [
        (
            "model=mlp",
            "resume='{path}': the checkpoint holds another model (gearshift.models.SimpleCNN)",
        ),
        ("task=regression", "resume='{path}': the checkpoint was trained for another task"),
        ("amp=onn", "amp='onn' is not allowed; choose one of: "),
    ],
    ids=["another-model", "another-task", "bad-value"],
)
def test_a_checkpoint_of_another_model_or_task_is_one_line(trained, capsys, override, start):
    run_dir, _ = trained
    checkpoint = latest_checkpoint(run_dir / "checkpoints")
    before = sorted(p.name for p in run_dir.iterdir())
    assert evaluate.main([f"resume={checkpoint}", override]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: " + start.format(path=checkpoint)), line
    assert sorted(p.name for p in run_dir.iterdir()) == before  # nothing written


def test_the_command_line_names_a_missing_checkpoint_in_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "gearshift.evaluate", "resume=/missing.pt"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=seconds(120),
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: resume='/missing.pt' is not allowed; no such checkpoint file"
    )


OWN_PACKAGE = """
from gearshift.tasks import Classification


class MyTask(Classification):
    pass
"""


def train_with_own_package(tmp_path, *overrides: str):
    """A checkpoint of a run whose task came from a package that is not on
    the path afterwards, as on the machine that exports or evaluates it."""
    package = tmp_path / "mine"
    package.mkdir()
    (package / "ownparts.py").write_text(OWN_PACKAGE)
    sys.path.insert(0, str(package))
    try:
        cfg = make_cfg(*GEARS, "max_steps=1", *overrides)
        fit(cfg, tmp_path / "run")
    finally:
        sys.path.remove(str(package))
        sys.modules.pop("ownparts", None)
    return latest_checkpoint(tmp_path / "run" / "checkpoints")


def test_export_does_not_import_the_task_of_ones_own_package(tmp_path, capsys):
    from gearshift import export

    checkpoint = train_with_own_package(tmp_path, "task._target_=ownparts.MyTask")
    assert export.main([f"resume={checkpoint}", f"out={tmp_path / 'out'}"]) == 0, capsys.readouterr().err  # fmt: skip
    assert (tmp_path / "out" / "model.pt").exists()
    assert "ownparts" not in sys.modules
