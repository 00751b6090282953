"""Sweeps on this machine (Hydra's basic launcher): W&B groups and names, the presets."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers import CONF, ROOT, check_amp_on_resolved, seconds, train_in_process
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from wandb_records import read_records

import gearshift.config  # noqa: F401  (registers the schema the configs build on)

TINY = (
    "model=mlp",
    "progress_bar=false",
    "data.num_samples=256",
    "data.num_val_samples=64",
    "data.image_size=16",
    "max_steps=2",
    "warmup_steps=0",
)


def sweep(tmp_path, *overrides: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "HOME": str(tmp_path)}
    env.pop("WANDB_API_KEY", None)
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "-m", *TINY, *overrides],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=seconds(timeout),
    )


def sweep_in_process(tmp_path, monkeypatch, *overrides: str) -> subprocess.CompletedProcess:
    """sweep() run inside this process (train_in_process), where the test is not about the
    sweep's own process: its start (seconds of imports) is saved."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "HOME": str(tmp_path)}
    return train_in_process("-m", *TINY, *overrides, cwd=tmp_path, env=env)


def wandb_run_record(run_dir):
    [log_file] = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    return next(r.run for r in read_records(log_file) if r.WhichOneof("record_type") == "run")


def test_sweep_runs_share_a_wandb_group_named_after_the_sweep(tmp_path, monkeypatch):
    sweep_dir = tmp_path / "multirun" / "amp-sweep"
    overrides = ("logger=wandb", "amp=off,bf16", f"hydra.sweep.dir={sweep_dir}")
    done = sweep_in_process(tmp_path, monkeypatch, *overrides)
    assert done.returncode == 0, done.stderr
    runs = [wandb_run_record(sweep_dir / str(n)) for n in (0, 1)]
    assert [r.run_group for r in runs] == ["amp-sweep", "amp-sweep"]
    # each run's name is its overrides (Hydra's override_dirname), so the points differ
    names = [r.display_name for r in runs]
    assert "amp=off" in names[0].split(",") and "amp=bf16" in names[1].split(","), names
    assert "model=mlp" in names[0].split(",")


def test_logger_group_wins_over_the_sweep_name(tmp_path):
    sweep_dir = tmp_path / "multirun" / "amp-sweep"
    overrides = ("logger=wandb", "logger.group=my-study", "amp=off", f"hydra.sweep.dir={sweep_dir}")
    done = sweep(tmp_path, *overrides)
    assert done.returncode == 0, done.stderr
    assert wandb_run_record(sweep_dir / "0").run_group == "my-study"


def test_a_single_run_has_no_group_unless_one_is_set(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *TINY, "logger=wandb", "amp=bf16"],
        cwd=tmp_path,
        env={**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=seconds(300),
    )
    assert done.returncode == 0, done.stderr
    [run_dir] = (tmp_path / "runs").iterdir()
    record = wandb_run_record(run_dir)
    assert record.run_group == ""
    assert "amp=bf16" in record.display_name.split(",")


def compose_cfg(*overrides: str, hydra: bool = False):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)


def changed_keys(a, b, prefix="") -> set[str]:
    keys = set()
    for key in a.keys() | b.keys():
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            keys |= changed_keys(x, y, f"{prefix}{key}.")
        elif x != y:
            keys.add(prefix + key)
    return keys


def test_the_ablation_sweeps_every_gear_file_and_each_switches_one_gear():
    cfg = compose_cfg("sweep=ablation", hydra=True)
    swept = cfg.hydra.sweeper.params.gear.split(",")
    assert sorted(swept) == sorted(p.stem for p in (CONF / "gear").glob("*.yaml"))
    baseline = OmegaConf.to_container(compose_cfg("gear=baseline"))
    assert baseline == OmegaConf.to_container(compose_cfg())  # the baseline is the defaults
    expected = {
        "amp": {"amp.dtype"},
        "channels_last": {"memory_format.channels_last"},
        "compile": {"compile.enabled"},
        "cudnn_benchmark": {"cudnn_benchmark"},
        "matmul_precision": {"matmul_precision"},
        "fused_optimizer": {"optimizer.fused"},
        "set_to_none": {"optimizer.set_to_none"},
    }
    for gear, keys in expected.items():
        assert changed_keys(baseline, OmegaConf.to_container(compose_cfg(f"gear={gear}"))) == keys
    loader = changed_keys(baseline, OmegaConf.to_container(compose_cfg("gear=dataloader")))
    assert loader and all(k.startswith("dataloader.") for k in loader)
    assert compose_cfg("gear=all") == compose_cfg("experiment=fast")


def log_times(run_dir) -> tuple[str, str]:
    """The first and last timestamps of a run's train.log."""
    lines = (run_dir / "train.log").read_text().splitlines()
    return lines[0][1:24], lines[-1][1:24]


def test_an_ablation_sweep_runs_each_gear_alone_in_its_own_process_and_reports(
    tmp_path, monkeypatch
):
    sweep_dir = tmp_path / "ablation"
    done = sweep_in_process(  # the sweep in this process; its jobs: each in a process
        tmp_path,
        monkeypatch,
        "logger=none",
        "sweep=ablation",
        "gear=baseline,amp",
        "seed=0",  # one repeat of each (the preset runs seeds 0, 1, 2)
        "data.num_samples=256",
        "data.image_size=16",
        f"hydra.sweep.dir={sweep_dir}",
    )
    assert done.returncode == 0, done.stderr
    gears = [json.loads((sweep_dir / n / "summary.json").read_text())["gears"] for n in "01"]
    assert gears[0]["amp"] == "off"
    check_amp_on_resolved(gears[1])  # amp=on
    assert all(g["num_workers"] == 0 and not g["data_on_device"] for g in gears)  # host data
    # hydra/launcher=processes: two jobs, two processes, the second after the first ended
    jobs = {log.name.split("_")[0] for log in (sweep_dir / ".submitit").glob("*_log.out")}
    assert len(jobs) == 2
    assert log_times(sweep_dir / "0")[1] <= log_times(sweep_dir / "1")[0]
    report = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "report.py"), "--no-plot", str(sweep_dir)],
        capture_output=True,
        text=True,
        timeout=seconds(120),
    )
    assert report.returncode == 0, report.stderr
    table = (sweep_dir / "report.md").read_text()
    assert "| gear=baseline | " in table and "| gear=amp | " in table
    assert "1.00x" in table
