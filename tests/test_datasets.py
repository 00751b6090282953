"""Data read from disk: image folders and CIFAR-10 files the tests write, staging, bad input."""

from __future__ import annotations

import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import (
    ROOT,
    ForwardRecorder,
    check_summary,
    fake_cpu_speed,
    make_cfg,
    only_summary,
    run_train,
    seconds,
    train_in_process,
)
from PIL import Image
from torch import nn

from gearshift.config import ConfigError, check_config
from gearshift.data.decode import UnreadableImage
from gearshift.data.host_loader import build_loader
from gearshift.data.staging import stage, staged_path
from gearshift.data_batches import data_batches
from train import fit

CPU = torch.device("cpu")
COLOURS = [(220, 40, 40), (40, 200, 40), (40, 40, 220)]


def write_images(root: Path, per_class: int, classes: int = 3, seed: int = 0) -> list[Path]:
    """root/c<k>/<i>.png|jpg: class k is COLOURS[k] plus noise, in sizes that vary."""
    rng = np.random.default_rng(seed)
    paths = []
    for k in range(classes):
        (root / f"c{k}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            shape = (18 + i % 5, 24 - i % 3, 3)  # not square, not the training size
            pixels = np.clip(np.array(COLOURS[k % 3]) + rng.normal(0, 25, shape), 0, 255)
            path = root / f"c{k}" / f"{i}.{'png' if i % 2 else 'jpg'}"
            Image.fromarray(pixels.astype(np.uint8)).save(path)
            paths.append(path)
    return paths


def folder_cfg(path: Path, *overrides: str):
    return make_cfg(
        "data=imagefolder",
        f"data.path={path}",
        "data.num_classes=3",
        "data.image_size=16",
        "data.num_samples=null",
        "data.num_val_samples=null",
        "batch_size=8",
        *overrides,
    )


def run_dir(tmp_path: Path) -> Path:
    """A run folder, as Hydra would have made it."""
    (tmp_path / "run").mkdir()
    return tmp_path / "run"


def plain(cfg_overrides: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Float batches made on the host, no normalisation: tensors show the decoded pixels / 255."""
    return ("data.batch_dtype=float32", "data.mean=null", "data.std=null", *cfg_overrides)


# ---------------------------------------------------------------- image folders


def test_imagefolder_trains_from_the_command_line(tmp_path):
    write_images(tmp_path / "images", per_class=6)
    (tmp_path / "work").mkdir()
    result = run_train(
        "data=imagefolder",
        f"data.path={tmp_path / 'images'}",
        "data.num_classes=3",
        "data.image_size=16",
        "model=simple_cnn",
        "batch_size=4",
        "max_steps=3",
        "logger=none",
        "progress_bar=false",
        cwd=tmp_path / "work",
    )
    assert result.returncode == 0, result.stderr
    summary = only_summary(tmp_path / "work")
    check_summary(summary, steps=3, samples=12)
    assert summary["gears"]["data_on_device"] is False


def test_imagefolder_learns_the_colour_of_each_class(tmp_path):
    write_images(tmp_path / "images", per_class=16)
    cfg = folder_cfg(tmp_path / "images", "model=simple_cnn", "data.val_fraction=0.25", "epochs=6")
    summary = fit(cfg, run_dir(tmp_path)).summary
    assert summary["val_accuracy"] == 1.0, summary
    assert summary["final_loss"] < 0.3


def test_split_is_per_class_seeded_and_disjoint(tmp_path):
    files = {str(p) for p in write_images(tmp_path, per_class=8)}

    def split(seed: int):
        cfg = folder_cfg(tmp_path, "data.val_fraction=0.25", f"data.split_seed={seed}")
        train, val = data_batches(cfg, CPU)
        return train.dataset.samples, val.dataset.samples

    train, val = split(0)
    assert {p for p, _ in train} | {p for p, _ in val} == files
    assert not {p for p, _ in train} & {p for p, _ in val}
    assert sorted(label for _, label in val) == [0, 0, 1, 1, 2, 2]  # 0.25 x 8 held out per class
    assert split(0) == (train, val)  # a new training seed or run: the same split
    assert split(1)[1] != val


def test_train_and_val_folders_are_used_as_given_with_the_training_labels(tmp_path):
    write_images(tmp_path / "train", per_class=4)
    write_images(tmp_path / "val", per_class=2)
    (tmp_path / "val" / "c0").rename(tmp_path / "val" / ".hidden")  # val lacks class c0
    train, val = data_batches(folder_cfg(tmp_path), CPU)
    assert len(train.dataset) == 12  # nothing held out of train/
    assert train.dataset.classes == ["c0", "c1", "c2"]
    assert sorted(label for _, label in val.dataset.samples) == [1, 1, 2, 2]
    assert all("/val/" in path for path, _ in val.dataset.samples)


def test_images_decode_to_their_pixels_at_the_training_size(tmp_path):
    for k, colour in enumerate(COLOURS):
        (tmp_path / f"c{k}").mkdir()
        Image.new("RGB", (30, 20), colour).save(tmp_path / f"c{k}" / "a.png")
        Image.new("RGB", (20, 40), colour).save(tmp_path / f"c{k}" / "b.jpg", quality=95)
    train, _ = data_batches(folder_cfg(tmp_path, *plain(), "data.val_fraction=0"), CPU)
    for (path, label), (image, target) in zip(train.dataset.samples, train.dataset, strict=True):
        assert image.shape == (3, 16, 16) and image.dtype == torch.float32, path
        expected = torch.tensor(COLOURS[label], dtype=torch.float32).view(3, 1, 1) / 255
        assert torch.allclose(image, expected.expand(3, 16, 16), atol=0.03), path
        assert target == label

    gray, _ = data_batches(folder_cfg(tmp_path, *plain(("data.channels=1",))), CPU)
    assert gray.dataset[0][0].shape == (1, 16, 16)

    normed, _ = data_batches(
        folder_cfg(
            tmp_path,
            "data.batch_dtype=float32",
            "data.mean=[0.5,0.5,0.5]",
            "data.std=[0.25,0.25,0.25]",
        ),
        "cpu",
    )
    raw, _ = data_batches(folder_cfg(tmp_path, *plain()), CPU)
    assert torch.allclose(normed.dataset[0][0], (raw.dataset[0][0] - 0.5) / 0.25)

    uint8, _ = data_batches(folder_cfg(tmp_path), CPU)  # the default: bytes, normalised later
    image = uint8.dataset[0][0]
    assert image.dtype == torch.uint8 and torch.equal(
        image, (raw.dataset[0][0] * 255).round().byte()
    )


def test_check_images_decode_catches_damage_that_the_header_check_misses(tmp_path):
    write_images(tmp_path, per_class=2)
    whole = (tmp_path / "c2" / "1.png").read_bytes()
    damaged = tmp_path / "c2" / "damaged.png"
    damaged.write_bytes(whole[: len(whole) // 2])  # a valid header, half the pixels
    with pytest.raises(ConfigError, match=re.escape(f"{damaged}: image file is truncated")):
        data_batches(folder_cfg(tmp_path, "data.check_images=decode"), CPU)

    train, _ = data_batches(folder_cfg(tmp_path, "data.val_fraction=0"), CPU)  # header: passes
    index = [path for path, _ in train.dataset.samples].index(str(damaged))
    with pytest.raises(UnreadableImage, match=re.escape(f"cannot decode image {damaged}")):
        train.dataset[index]  # named when the loader reaches it


def test_num_samples_takes_a_seeded_subset(tmp_path):
    write_images(tmp_path, per_class=8)
    cfg = folder_cfg(tmp_path, "data.num_samples=5", "data.num_val_samples=0")
    train, val = data_batches(cfg, CPU)
    assert len(train.dataset) == 5 and val is None
    again, _ = data_batches(cfg, CPU)
    assert again.dataset.samples == train.dataset.samples


def test_augment_varies_training_images_only(tmp_path):
    pixels = np.zeros((16, 16, 3), np.uint8)
    pixels[:, :8] = 255  # white left half, black right half: a flip shows
    for k in range(3):
        (tmp_path / f"c{k}").mkdir()
        for i in range(4):
            Image.fromarray(pixels).save(tmp_path / f"c{k}" / f"{i}.png")
    cfg = folder_cfg(
        tmp_path, "data.augment=true", "data.val_fraction=0.25", "data.batch_dtype=float32"
    )  # augmented on the host; on the device: test_images_uint8.py
    train, val = data_batches(cfg, CPU)
    draws = torch.stack([train.dataset[0][0] for _ in range(32)])
    assert (draws != draws[0]).any(dim=(1, 2, 3)).sum() >= 8  # shifted and flipped
    left_brighter = draws[..., :8].mean(dim=(1, 2, 3)) > draws[..., 8:].mean(dim=(1, 2, 3))
    assert left_brighter.any() and not left_brighter.all()  # both orientations
    val_draws = torch.stack([val.dataset[0][0] for _ in range(5)])
    assert (val_draws == val_draws[0]).all()
    assert (val_draws[0, :, :, :8].mean() > val_draws[0, :, :, 8:].mean()).all()


def test_worker_processes_load_the_same_batches(tmp_path):
    write_images(tmp_path, per_class=6)
    cfg = folder_cfg(tmp_path, "data.val_fraction=0.5")
    _, val = data_batches(cfg, CPU)
    cfg = folder_cfg(tmp_path, "dataloader.num_workers=2")
    workers = build_loader(val.dataset, cfg.dataloader, cfg.batch_size, CPU, False, 0)
    assert workers.loader.num_workers == 2
    for (a, la), (b, lb) in zip(val, workers, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_mobilenet_from_torchvision_trains_with_amp_and_channels_last(tmp_path, monkeypatch):
    """model._target_ reaches any importable model, with no code change."""
    fake_cpu_speed(monkeypatch, 1.4)  # amp=on picks bf16, as on a CPU with native bf16
    write_images(tmp_path / "images", per_class=6)
    cfg = folder_cfg(
        tmp_path / "images",
        "model._target_=torchvision.models.mobilenet_v3_small",
        "model.num_classes=3",
        "data.image_size=32",
        "amp=on",
        "memory_format=channels_last",
        "max_steps=2",
    )
    check_config(cfg)
    with ForwardRecorder(nn.Conv2d) as seen:
        result = fit(cfg, run_dir(tmp_path))
    assert type(result.model).__name__ == "MobileNetV3"
    assert result.summary["steps"] == 2 and np.isfinite(result.summary["final_loss"])
    convs = seen.training()
    assert {out.dtype for _, _, out, _ in convs} == {torch.bfloat16}
    first_input = convs[0][1]
    assert first_input.shape[1:] == (3, 32, 32)
    assert first_input.is_contiguous(memory_format=torch.channels_last)
    weight = result.model.features[0][0].weight
    assert weight.is_contiguous(memory_format=torch.channels_last)
    assert not weight.is_contiguous()


# ---------------------------------------------------------------- CIFAR-10


def write_cifar(root: Path, per_batch: int = 6) -> Path:
    """root/cifar-10-batches-py/ in torchvision's format; image 0 of data_batch_1 is red."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (per_batch, 3 * 32 * 32), dtype=np.uint8)
        if name == "data_batch_1":
            data[0] = 0
            data[0, :1024] = 255  # rows are the red plane, then green, then blue
        labels = [int(x) for x in rng.integers(0, 10, per_batch)]
        with open(folder / name, "wb") as f:
            pickle.dump({"batch_label": name, "data": data, "labels": labels}, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"class{i}" for i in range(10)]}, f)
    return folder


def cifar_cfg(path: Path, *overrides: str):
    return make_cfg(
        "data=cifar10",
        f"data.path={path}",
        "data.num_samples=null",
        "data.num_val_samples=null",
        "batch_size=8",
        *overrides,
    )


def test_cifar10_files_train_through_fit(tmp_path):
    write_cifar(tmp_path / "cifar")
    summary = fit(cifar_cfg(tmp_path / "cifar", "max_steps=4"), run_dir(tmp_path)).summary
    check_summary(summary, steps=4, samples=30)  # 5 x 6 images, batches of 8: 8+8+8+6


def test_cifar10_images_keep_their_planes_and_labels(tmp_path):
    folder = write_cifar(tmp_path)
    with open(folder / "data_batch_1", "rb") as f:
        labels = pickle.load(f)["labels"]
    for path in (tmp_path, folder):  # the parent folder or the batch folder itself
        train, val = data_batches(cifar_cfg(path, *plain(), "data.image_size=32"), CPU)
        assert len(train.dataset) == 30 and len(val.dataset) == 6
        image, label = train.dataset[0]
        assert image.shape == (3, 32, 32) and image.dtype == torch.float32
        assert (image[0] == 1).all() and (image[1:] == 0).all()
        assert label.dtype == torch.int64 and int(label) == labels[0]
    resized, _ = data_batches(cifar_cfg(tmp_path, "data.image_size=16"), CPU)
    assert resized.dataset[0][0].shape == (3, 16, 16)


def test_cifar10_missing_or_damaged_files_are_named(tmp_path):
    folder = write_cifar(tmp_path)
    (folder / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(ConfigError, match=r"data_batch_3 is not a CIFAR-10 batch file"):
        data_batches(cifar_cfg(tmp_path), CPU)
    (folder / "test_batch").unlink()
    with pytest.raises(ConfigError, match=r"lacks test_batch"):
        data_batches(cifar_cfg(tmp_path), CPU)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(ConfigError, match=r"holds no cifar-10-batches-py/"):
        data_batches(cifar_cfg(tmp_path / "elsewhere"), CPU)


# -------------------------------------------------------------- staging (tip 1, docs/gears.md)


def test_fit_reads_the_staged_copy(tmp_path):
    write_images(tmp_path / "images", per_class=4)
    cfg = folder_cfg(tmp_path / "images", f"data.stage_to={tmp_path / 'local'}", "max_steps=1")
    train, _ = data_batches(cfg, CPU)
    staged = staged_path(tmp_path / "images", tmp_path / "local")
    assert staged.is_dir()
    assert all(Path(p).is_relative_to(staged) for p, _ in train.dataset.samples)
    assert fit(cfg, run_dir(tmp_path)).summary["steps"] == 1


def test_stage_copies_once_then_reuses(tmp_path):
    write_images(tmp_path / "src", per_class=2)
    copies = []

    def counting_copy(src, dst):
        copies.append(dst)
        return shutil.copytree(src, dst)

    first = stage(tmp_path / "src", tmp_path / "local", copy=counting_copy)
    second = stage(tmp_path / "src", tmp_path / "local", copy=counting_copy)
    assert first == second and len(copies) == 1
    assert _tree(first) == _tree(tmp_path / "src")


STAGE_SCRIPT = textwrap.dedent(
    """
    import shutil, sys, time
    from pathlib import Path
    from gearshift.data.staging import stage

    src, dst, log, go, pause = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]), float(sys.argv[5])

    def slow_copy(a, b):
        with open(log, "a") as f:
            f.write(f"start {time.time()}\\n")
        shutil.copytree(a, b)
        time.sleep(pause)  # a big dataset: the copy takes a while
        with open(log, "a") as f:
            f.write(f"end {time.time()}\\n")

    Path(f"{log}.ready-{sys.argv[6]}").touch()  # imported: now waiting for go
    while not go.exists():
        time.sleep(0.01)
    print(stage(src, dst, copy=slow_copy), time.time())
    """
)


def _stage_process(tmp_path: Path, pause: float, name: str = "0") -> subprocess.Popen:
    args = [tmp_path / "src", tmp_path / "local", tmp_path / "copies.log", tmp_path / "go"]
    return subprocess.Popen(
        [sys.executable, "-c", STAGE_SCRIPT, *map(str, args), str(pause), name],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )


def wait_until(condition, processes: list[subprocess.Popen], timeout: float = 60) -> None:
    """Poll `condition` while every process lives, within a scaled time limit."""
    deadline = time.monotonic() + seconds(timeout)
    while not condition():
        assert all(p.poll() is None for p in processes), "a process ended early"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_two_processes_starting_together_copy_once_and_share_it(tmp_path):
    write_images(tmp_path / "src", per_class=3)
    processes = [_stage_process(tmp_path, pause=1.0, name=str(i)) for i in range(2)]
    wait_until(lambda: len(list(tmp_path.glob("copies.log.ready-*"))) == 2, processes)
    (tmp_path / "go").touch()
    outputs = [p.communicate(timeout=seconds(60))[0].split() for p in processes]
    assert [p.returncode for p in processes] == [0, 0]
    events = (tmp_path / "copies.log").read_text().split()
    assert events[0::2] == ["start", "end"]  # one copy only
    copy_end = float(events[3])
    assert outputs[0][0] == outputs[1][0]
    assert all(float(done) >= copy_end for _, done in outputs)  # the other one waited
    staged = Path(outputs[0][0])
    assert _tree(staged) == _tree(tmp_path / "src")
    assert sorted(p.name for p in (tmp_path / "local").iterdir()) == [
        staged.name,
        f"{staged.name}.lock",
    ]


def test_a_copy_killed_halfway_is_never_used(tmp_path):
    write_images(tmp_path / "src", per_class=2)
    (tmp_path / "go").touch()
    killed = _stage_process(tmp_path, pause=60)
    # inside the copy, holding the lock: its temporary folder exists
    wait_until(lambda: list((tmp_path / "local").glob("*.tmp-*")), [killed])
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=seconds(10))
    target = staged_path(tmp_path / "src", tmp_path / "local")
    assert not target.exists()  # the half-finished copy never took the final name
    assert list((tmp_path / "local").glob("*.tmp-*"))

    staged = stage(tmp_path / "src", tmp_path / "local")  # the lock died with its holder
    assert staged == target and _tree(staged) == _tree(tmp_path / "src")
    assert not list((tmp_path / "local").glob("*.tmp-*"))


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.path=null", "data.path=None is not allowed; data=imagefolder reads a folder"),
        (
            "data.val_fraction=1.0",
            "data.val_fraction=1.0 is not allowed; expected a number >= 0 and < 1",
        ),
        ("data.check_images=maybe", "data.check_images='maybe' is not allowed; choose one of"),
        ("data.channels=4", "data.channels=4 is not allowed; imagefolder takes 1 or 3"),
        ("data.mean=[0.5]", "data.mean=[0.5] is not allowed; expected 3 values, one per channel"),
        ("data.std=null", "data.std=None is not allowed; set data.mean and data.std together"),
        ("data.on_device=true", "data.on_device=True is not allowed; only synthetic data"),
        (
            "data.stage_to=IMAGES/sub",
            "data.stage_to='IMAGES/sub' is not allowed; it lies inside data.path",
        ),
    ],
)
def test_check_config_catches_bad_data_values(tmp_path, override, message):
    cfg = folder_cfg(tmp_path, override.replace("IMAGES", str(tmp_path)))
    message = message.replace("IMAGES", str(tmp_path))
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(cfg)


def test_check_config_catches_keys_that_do_not_fit_the_source(tmp_path):
    with pytest.raises(ConfigError, match=r"data\.num_classes=100 is not allowed; CIFAR-10 has 10"):
        check_config(cifar_cfg(tmp_path, "data.num_classes=100"))
    message = "data.stage_to='/tmp' is not allowed; it applies to data read from disk only"
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(make_cfg("data.stage_to=/tmp"))  # data=synthetic


def test_data_problems_found_at_start_are_config_errors(tmp_path):
    write_images(tmp_path / "train", per_class=4)
    write_images(tmp_path / "val", per_class=1, classes=4)  # c3 is not a training class
    message = f"{tmp_path / 'val'} has class folder(s) not in train/: c3; rename or remove them"
    with pytest.raises(ConfigError, match=re.escape(message)):
        data_batches(folder_cfg(tmp_path), CPU)
    shutil.rmtree(tmp_path / "val")
    (tmp_path / "train" / "c3").mkdir()
    with pytest.raises(ConfigError, match="class folder\\(s\\) with no images: c3"):
        data_batches(folder_cfg(tmp_path, "data.num_classes=4"), CPU)
    (tmp_path / "train" / "c3").rmdir()
    message = "batch_size=16 is not allowed; with dataloader.drop_last=true it must be <= the 12"
    with pytest.raises(ConfigError, match=re.escape(message)):
        data_batches(folder_cfg(tmp_path, "batch_size=16", "dataloader.drop_last=true"), CPU)
    message = "data.path='/no/cifar' is not allowed; no such folder; point it at the dataset's folder or set data.download=true"
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(cifar_cfg(Path("/no/cifar")))


def _make_bad_folder(kind: str, root: Path) -> str:
    """A data folder with one problem; returns the expected error line."""
    images = root / "images"
    if kind == "missing":
        return "error: data.path='/does/not/exist' is not allowed; no such folder; point it at the dataset's folder"
    if kind == "empty":
        (images / "c0").mkdir(parents=True)
        (images / "c0" / "notes.txt").write_text("no images here")
        return f"error: data.path='{images}' is not allowed; found no images"
    write_images(images, per_class=2)
    if kind == "corrupt":
        (images / "c1" / "broken.jpg").write_bytes(b"\xff\xd8 truncated nonsense")
        return f"error: data.path='{images}' is not allowed; {images / 'c1' / 'broken.jpg'}: not an image file PIL can read; remove or replace it"
    assert kind == "classes"
    return f"error: data.num_classes=10 is not allowed; {images} has 3 class folders (c0, c1, c2); set data.num_classes=3"


def _bad_data_args(kind: str, tmp_path: Path) -> list[str]:
    path = "/does/not/exist" if kind == "missing" else str(tmp_path / "images")
    overrides = [] if kind == "classes" else ["data.num_classes=3"]
    return ["data=imagefolder", f"data.path={path}", *overrides, "logger=none"]


@pytest.mark.parametrize("kind", ["missing", "empty", "corrupt", "classes"])
def test_bad_data_stops_before_training_with_one_line(tmp_path, kind):
    # what `python train.py` checks, in this process (a fresh one per case costs 4 s); the
    # command line's exit code and its missing run folder are the test below's
    expected = _make_bad_folder(kind, tmp_path).removeprefix("error: ")
    cfg = make_cfg(*_bad_data_args(kind, tmp_path), tiny=False)
    folder = run_dir(tmp_path)
    with pytest.raises(ConfigError) as error:
        check_config(cfg)
        fit(cfg, folder)
    assert str(error.value).startswith(expected)
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize(
    "kind",
    [
        "corrupt",
        *(pytest.param(k, marks=pytest.mark.slow) for k in ("missing", "empty", "classes")),
    ],
)
def test_bad_data_is_one_line_exit_2_and_no_run_folder(tmp_path, kind):
    expected = _make_bad_folder(kind, tmp_path)
    (tmp_path / "work").mkdir()
    result = train_in_process(*_bad_data_args(kind, tmp_path), cwd=tmp_path / "work")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), result.stderr
    assert list((tmp_path / "work").iterdir()) == []  # no runs/, nothing half-written
