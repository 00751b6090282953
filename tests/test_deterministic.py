"""deterministic=true: bitwise-equal runs, the switches it flips, seeded loader workers."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from helpers import CONF, make_cfg
from torch.utils.data import Dataset

from gearshift.app import preflight
from gearshift.config import ConfigError, check_config
from gearshift.data.host_loader import build_loader
from gearshift.data.synthetic import synthetic_images
from gearshift.engine.runtime import configure_determinism
from train import fit


class NoisyImages(Dataset):
    """Training images with noise drawn in the loader's worker, from torch's global stream
    there: only seeded workers draw the same noise twice."""

    def __init__(self, images: Dataset) -> None:
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        image, label = self.images[index]
        return image + 0.5 * torch.randn(image.shape), label


def noisy_images(**synthetic):
    """A data source: data=synthetic's images, the training ones augmented in the workers."""
    train, val = synthetic_images(**synthetic)
    return NoisyImages(train), val


# A CNN, a loader worker augmenting on the host, a random crop and flip on the device.
AUGMENTED = (
    "model=simple_cnn",
    "data._target_=test_deterministic.noisy_images",
    "data.on_device=false",
    "dataloader.num_workers=1",
    "device_transforms.hflip=true",
    "device_transforms.crop_padding=2",
    "max_steps=4",
    "data.num_val_samples=0",
)


@pytest.fixture
def one_compute_thread():
    """The loader worker gets a core of its own: beside two compute threads on a 2-core
    machine every step ran 3-4x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_compute_thread")
def test_two_deterministic_runs_give_bitwise_equal_parameters(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    cfg = make_cfg(*AUGMENTED, "deterministic=true", "cudnn_benchmark=true")
    with caplog.at_level(logging.INFO, logger="gearshift"):
        first = fit(cfg, tmp_path / "a")
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert "deterministic: cudnn_benchmark=true is off" in caplog.text
    assert first.summary["gears"]["deterministic"] is True
    assert first.summary["gears"]["cudnn_benchmark"] is False
    second = fit(cfg, tmp_path / "b")
    other_seed = fit(make_cfg(*AUGMENTED, "deterministic=true", "seed=1"), tmp_path / "c")
    params = [dict(run.model.state_dict()) for run in (first, second, other_seed)]
    for name, value in params[0].items():
        assert torch.equal(value, params[1][name]), name
    assert not all(torch.equal(v, params[2][k]) for k, v in params[0].items())


def test_the_switches_follow_each_run(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    configure_determinism("warn")
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.is_deterministic_algorithms_warn_only_enabled()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    configure_determinism(False)  # the next run of a sweep in this process
    assert not torch.are_deterministic_algorithms_enabled()
    assert not torch.backends.cudnn.deterministic
    with pytest.raises(ConfigError, match=r"^deterministic='sometimes' is not allowed"):
        check_config(make_cfg("deterministic=sometimes"))


def test_preflight_sets_the_cublas_workspace_before_a_sweeps_first_run(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    preflight(CONF, argv=["-m", "deterministic=false"])
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    preflight(CONF, argv=["-m", "deterministic=false,true"])  # the first run is not
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the user's own setting stays
    preflight(CONF, argv=["deterministic=warn"])
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


class Draws(Dataset):
    """Each sample: a number drawn in the worker from torch's global stream."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int):
        return torch.rand(()), index


def test_loader_workers_are_seeded_by_seed_rank_and_epoch():
    cfg = make_cfg("data.on_device=false", "dataloader.num_workers=2", "batch_size=2")
    cpu = torch.device("cpu")

    def draws(epoch: int = 0, rank: int = 0, seed: int = 0) -> torch.Tensor:
        batches = build_loader(
            Draws(), cfg.dataloader, cfg.batch_size, cpu, train=False, seed=seed, rank=rank
        )
        batches.set_epoch(epoch)
        return torch.cat([values for values, _ in batches])

    first = draws()
    torch.rand(100)  # the global stream moves on: the workers' draws do not depend on it
    assert torch.equal(draws(), first)
    assert torch.equal(draws(epoch=1), draws(epoch=1))
    for other in (draws(epoch=1), draws(rank=1), draws(seed=1)):
        assert not torch.equal(other, first)


@pytest.mark.gpu
def test_two_deterministic_cuda_runs_give_bitwise_equal_parameters(tmp_path):
    """cuDNN's convolutions (and the autotuner, asked for and refused), cuBLAS with its
    fixed workspace, random crops and flips on the device."""
    cfg = make_cfg(
        "device=cuda",
        "model=resnet18",
        "deterministic=true",
        "cudnn_benchmark=true",
        "device_transforms.hflip=true",
        "device_transforms.crop_padding=2",
        "max_steps=6",
        "data.num_val_samples=0",
    )
    first, second = (fit(cfg, tmp_path / name).model.state_dict() for name in "ab")
    assert not torch.backends.cudnn.benchmark and torch.backends.cudnn.deterministic
    for name, value in first.items():
        assert torch.equal(value, second[name]), name
