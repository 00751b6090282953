"""model.init_from=PATH: a new run starts from a checkpoint's weights, with its own fresh
optimizer, step 0 and new config; misfits are one line, or loaded in part (init_strict)."""

from __future__ import annotations

import sys

import pytest
import torch
from helpers import CONF, make_cfg, train_in_process
from hydra import compose, initialize_config_dir
from test_make_it_yours import COMMAND, TINY, work  # noqa: F401 (a fixture)

from gearshift.build import Run, build_run
from gearshift.config import ConfigError
from gearshift.parallel.distributed import Ranks
from gearshift.state.checkpoint_folders import latest_checkpoint
from gearshift.state.checkpoint_reads import load_checkpoint
from train import fit, train

CPU = torch.device("cpu")


def trained(cfg, folder) -> dict:
    """Train `cfg` for 2 steps in `folder`; its checkpoint's path and model weights."""
    fit(cfg, folder)
    path = latest_checkpoint(folder / "checkpoints")
    return {"path": path, "model": load_checkpoint(path)["model"]}


def assert_started_from(run: Run, weights: dict) -> None:
    """The run's model holds `weights` exactly; optimizer and position are fresh."""
    ours = run.model.state_dict()
    assert ours.keys() == weights.keys()
    for name, tensor in weights.items():
        assert torch.equal(ours[name], tensor), name
    assert all(
        o.state_dict()["state"] == {} for o in run.optimizers.optimizers
    )  # no moments, no step counts
    assert run.position.step == 0 and run.position.epoch == 0


def test_resnet18_starts_from_a_checkpoints_weights_with_a_fresh_optimizer(tmp_path):
    small = ("logger=none", "progress_bar=false", "model=resnet18", "data.image_size=16",
             "data.num_samples=64", "batch_size=16")  # fmt: skip
    saved = trained(make_cfg(*small, "max_steps=2"), tmp_path / "first")
    # a new config: another optimizer and lr, more steps
    cfg = make_cfg(*small, f"model.init_from={saved['path']}", "optimizer=adamw", "max_steps=3")
    run = build_run(cfg, tmp_path / "second", Ranks(), "none", CPU)
    assert_started_from(run, saved["model"])
    assert run.total_steps == 3 and isinstance(run.optimizers.optimizers[0], torch.optim.AdamW)
    assert train(run, tmp_path / "second", None).summary["steps"] == 3  # trains on from there


def test_the_make_it_yours_model_starts_from_its_checkpoint(work, monkeypatch):  # noqa: F811
    monkeypatch.syspath_prepend(str(work))
    searchpath = COMMAND[0].replace("file://conf", f"file://{work / 'conf'}")

    def cfg(*overrides):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose("config", overrides=[searchpath, *COMMAND[1:], *TINY, *overrides])

    saved = trained(cfg("max_steps=2"), work / "first")
    assert any(name.startswith("net.") for name in saved["model"])  # the Denoiser's
    run = build_run(cfg(f"model.init_from={saved['path']}", "optimizer.lr=0.01"),
                    work / "second", Ranks(), "none", CPU)  # fmt: skip
    assert_started_from(run, saved["model"])
    sys.modules.pop("myproject", None)


def mlp(hidden: int, *overrides: str):
    return make_cfg("logger=none", "progress_bar=false", "model=mlp", f"model.hidden={hidden}",
                    "data.image_size=8", "max_steps=2", *overrides)  # fmt: skip


def test_weights_of_another_shape_are_one_line_or_loaded_in_part(tmp_path):
    saved = trained(mlp(32), tmp_path / "first")
    with pytest.raises(ConfigError) as error:
        build_run(mlp(64, f"model.init_from={saved['path']}"), tmp_path / "b", Ranks(), "none", CPU)  # fmt: skip
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"model.init_from={str(saved['path'])!r}")
    assert "reshaped" in message and "[32, " in message and "(model: [64, " in message, message
    cfg = mlp(64, f"model.init_from={saved['path']}", "model.init_strict=false")
    run = build_run(cfg, tmp_path / "c", Ranks(), "none", CPU)
    ours = run.model.state_dict()
    fitting = [k for k, v in saved["model"].items() if v.shape == ours[k].shape]
    assert fitting and len(fitting) < len(ours)  # the last layer's bias fits, the rest not
    for name in fitting:
        assert torch.equal(ours[name], saved["model"][name]), name


def test_a_file_that_is_no_checkpoint_is_one_line_exit_2_and_no_run_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("not weights")
    done = train_in_process("logger=none", "model=mlp", "data.image_size=8", "max_steps=1",
                     f"model.init_from={tmp_path / 'notes.txt'}", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith(f"error: model.init_from={str(tmp_path / 'notes.txt')!r} is not allowed; it is not a gearshift checkpoint")  # fmt: skip
    assert not (tmp_path / "runs").exists()
