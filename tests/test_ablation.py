"""sweep=ablation's rounds, the README's ablation commands, and one real ablation of a few
gears whose report tells what did not act on this machine."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from helpers import CONF, ROOT, seconds, train_in_process
from hydra import compose, initialize_config_dir
from wandb_records import read_records

import gearshift.config  # noqa: F401  (registers the schema the configs build on)


def ablation_params(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["sweep=ablation", *overrides], return_hydra_config=True)
    return cfg.hydra.sweeper.params


def test_the_ablation_runs_rounds_with_the_baseline_mid_round():
    params = ablation_params()
    assert params.seed == "range(0,5)"  # seed is the round: the outer loop
    assert ablation_params("sweep.rounds=8").seed == "range(0,8)"
    gears = params.gear.split(",")
    assert gears.index("baseline") == len(gears) // 2  # at most 5 runs from any gear
    assert list(params) == ["seed", "gear"]  # Hydra's product: gear varies fastest


def test_no_rounds_is_one_error_line_and_no_sweep_folder(tmp_path):
    result = train_in_process("-m", "sweep=ablation", "sweep.rounds=0", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: sweep.rounds=0 is not allowed; expected an integer >= 1"
    assert list(tmp_path.iterdir()) == []


def readme_ablation_commands() -> list[list[str]]:
    """The argument lists of the `make ablation ARGS=...` lines of docs/sweeps.md."""
    section = (ROOT / "docs" / "sweeps.md").read_text()
    blocks = re.findall(r"^```bash\n(.*?)^```$", section, re.S | re.M)
    commands = []
    for line in (line for block in blocks for line in block.splitlines()):
        words = shlex.split(line, comments=True)
        if words[:2] == ["make", "ablation"]:
            args = next((w.split("=", 1)[1] for w in words if w.startswith("ARGS=")), "")
            commands.append(shlex.split(args))
    return commands


def test_the_readmes_ablation_commands_compose():
    commands = readme_ablation_commands()
    assert [] in commands and ["sweep.rounds=3"] in commands
    for args in commands:
        params = ablation_params(*args)  # raises if the page names a key that is not there
        rounds = next((a.split("=")[1] for a in args if "sweep.rounds" in a), "5")
        assert params.seed == f"range(0,{rounds})"


TINY = (
    "model=mlp",
    "progress_bar=false",
    "data.num_samples=256",
    "data.image_size=16",
    "max_steps=3",
    "warmup_steps=1",
)


@pytest.mark.slow
def test_an_ablation_of_a_few_gears_reports_what_did_not_act_here(tmp_path):
    sweep_dir = tmp_path / "ablation"
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "HOME": str(tmp_path)}
    env.pop("WANDB_API_KEY", None)
    command = [sys.executable, str(ROOT / "train.py"), "-m", "sweep=ablation", *TINY]
    command += ["gear=baseline,cudnn_benchmark,dataloader", "sweep.rounds=2", "logger=wandb"]
    command += [f"hydra.sweep.dir={sweep_dir}"]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=seconds(300)
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in sweep_dir.iterdir() if p.name.isdigit()) == list("012345")
    report = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "report.py"), "--no-plot", str(sweep_dir)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=seconds(120),
    )
    assert report.returncode == 0, report.stderr
    found = {
        c["name"]: c for c in json.loads((sweep_dir / "report.json").read_text())["configurations"]
    }
    assert found["gear=baseline"]["pairs"] == 2
    cudnn = found["gear=cudnn_benchmark"]
    assert cudnn["class"] == "did not act" and cudnn["pairs"] == 2
    assert "acts on CUDA only (ran on cpu)" in cudnn["did_not_act_because"][0]
    workers = json.loads((sweep_dir / "2" / "summary.json").read_text())  # round 0's loader run
    loader = found["gear=dataloader"]
    if workers["gears"]["num_workers"] == 0:  # auto on a CPU: the cores compute, no worker
        assert loader["class"] == "did not act"
        assert loader["did_not_act_because"][0].startswith("num_workers resolved to 0 (auto:")
    else:  # a machine with free cores: workers acted
        assert loader["acted"]["num_workers"] == [0, workers["gears"]["num_workers"]]
    # the report's W&B run sits in the sweep's group with the runs
    runs = [
        next(r.run for r in read_records(p) if r.WhichOneof("record_type") == "run")
        for p in sweep_dir.glob("**/wandb/offline-run-*/run-*.wandb")
    ]
    groups = {(r.display_name == "gear report", r.run_group) for r in runs}
    assert groups == {(False, "ablation"), (True, "ablation")}
