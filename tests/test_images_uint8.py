"""Real images at speed: uint8 batches normalised and augmented on the device, the JPEG
decoders, staged resized copies, and a damaged file found mid-epoch."""

from __future__ import annotations

import os
import re
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import ROOT, ForwardRecorder, make_cfg, run_train, stops_at_damaged_file
from PIL import Image
from test_checkpoint import assert_same_parameters, stop_and_resume
from test_datasets import CPU, folder_cfg, run_dir, write_cifar
from torch import nn

from gearshift.config import ConfigError, check_config
from gearshift.data import decode
from gearshift.data.decode import (
    JPEG_DECODERS,
    ImageDecoder,
    UnreadableImage,
    choose_decoder,
    installed,
    time_decoders,
)
from gearshift.data.device_transforms import DeviceTransforms
from gearshift.data.resized import RAW_FILE
from gearshift.data.staging import staged_path
from gearshift.data.transforms_off import source_transforms
from gearshift.data_batches import data_batches
from gearshift.state.checkpoint_reads import load_checkpoint
from train import fit

NORMALISED = ("data.mean=[0.5,0.4,0.3]", "data.std=[0.2,0.25,0.3]")


def photo(height: int, width: int, seed: int = 0, cell: int = 8, noise: float = 6) -> np.ndarray:
    """A smooth colour field with noise: compresses like a photograph."""
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 255, (height // cell + 2, width // cell + 2, 3)).astype(np.uint8)
    smooth = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC), float)
    return np.clip(smooth + rng.normal(0, noise, smooth.shape), 0, 255).astype(np.uint8)


def write_photos(root: Path, per_class: int, size: tuple[int, int] = (40, 52)) -> None:
    for k in range(3):
        (root / f"c{k}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = photo(*size, seed=10 * k + i)
            pixels[..., k] = np.maximum(pixels[..., k], 160)  # the class shows in one channel
            Image.fromarray(pixels).save(root / f"c{k}" / f"{i}.jpg", quality=90)


def transforms_for(dataset, cfg) -> DeviceTransforms:
    return DeviceTransforms(
        cfg.device_transforms, CPU, torch.contiguous_format, cfg.seed, source_transforms(dataset)
    )


# ---------------------------------------------------------------- uint8 to the device


@pytest.mark.parametrize("source", ["imagefolder", "cifar10"])
def test_uint8_batches_become_on_the_device_what_the_host_made(tmp_path, source):
    if source == "imagefolder":
        write_photos(tmp_path, per_class=4)
        cfg = lambda *o: folder_cfg(  # noqa: E731
            tmp_path, *NORMALISED, "data.decoder=pil", "data.val_fraction=0.25", *o
        )
    else:
        write_cifar(tmp_path)
        cfg = lambda *o: make_cfg(  # noqa: E731
            "data=cifar10", f"data.path={tmp_path}", "data.num_samples=null",
            "data.num_val_samples=null", "batch_size=8", "data.image_size=24", *NORMALISED, *o,
        )  # fmt: skip
    host, host_val = data_batches(cfg("data.batch_dtype=float32"), CPU)
    device, device_val = data_batches(cfg(), CPU)
    transforms = transforms_for(device.dataset, cfg())
    for (a, la), (b, lb) in zip([*host, *host_val], [*device, *device_val], strict=True):
        assert b.dtype == torch.uint8 and a.dtype == torch.float32
        assert torch.equal(la, lb)
        assert torch.allclose(transforms(b, train=False), a, atol=1e-5)
        assert b.element_size() * 4 == a.element_size()  # a quarter of the bytes to copy


def test_device_augmentation_draws_what_the_host_draws(tmp_path):
    pixels = np.zeros((12, 12, 3), np.uint8)
    pixels[:, :4] = 255  # a bright band on the left: flips and shifts move it
    pixels[3:6, 6:9, 1] = 200
    for k in range(3):
        (tmp_path / f"c{k}").mkdir()
        Image.fromarray(pixels).save(tmp_path / f"c{k}" / "a.png")
    common = ("data.augment=true", "data.image_size=12", *NORMALISED, "data.val_fraction=0")
    host, _ = data_batches(folder_cfg(tmp_path, *common, "data.batch_dtype=float32"), CPU)
    device, _ = data_batches(folder_cfg(tmp_path, *common), CPU)
    draws = 1800
    host_draws = torch.stack([host.dataset[0][0] for _ in range(draws)])
    image = device.dataset[0][0]
    transforms = transforms_for(device.dataset, folder_cfg(tmp_path, *common))
    device_draws = torch.cat(
        [transforms(image.expand(100, -1, -1, -1), train=True) for _ in range(draws // 100)]
    )
    # Every possible outcome: a window of the image padded by 1 (3 x 3 offsets), mirrored or
    # not, normalised. Each draw must be one of the 18, and each path must draw all 18 alike.
    mean, std = torch.tensor([0.5, 0.4, 0.3]).view(3, 1, 1), torch.tensor([0.2, 0.25, 0.3])
    padded = torch.nn.functional.pad(image.float() / 255, (1, 1, 1, 1))
    windows = [padded[:, dy : dy + 12, dx : dx + 12] for dy in range(3) for dx in range(3)]
    outcomes = torch.stack([w.flip(2) if f else w for f in (0, 1) for w in windows])
    outcomes = (outcomes - mean) / std.view(3, 1, 1)
    counts = []
    for drawn in (host_draws, device_draws):
        distance = torch.cdist(drawn.flatten(1), outcomes.flatten(1))
        assert distance.min(1).values.max() < 1e-3  # every draw is one of the outcomes
        counts.append(torch.bincount(distance.argmin(1), minlength=18))
    for count in counts:  # uniform: 100 each expected, 4.5 sigma either way
        assert count.min() > 55 and count.max() < 145, count
    assert abs(counts[0][9:].sum() - counts[1][9:].sum()) < 150  # flips: ~900 each
    still = transforms(image.expand(4, -1, -1, -1), train=False)  # validation: no augmentation
    expected = (image.float() / 255 - mean) / std.view(3, 1, 1)
    assert torch.allclose(still, expected.expand(4, -1, -1, -1), atol=1e-5)


def test_training_on_uint8_batches_feeds_the_model_normalised_channels_last_floats(tmp_path):
    write_photos(tmp_path / "images", per_class=4)
    cfg = folder_cfg(
        tmp_path / "images", *NORMALISED, "model=simple_cnn", "max_steps=3", "dataloader=tuned",
        "dataloader.num_workers=2", "memory_format=channels_last", "accum=2",
        "data.augment=true", "device_transforms.hflip=true",
    )  # fmt: skip
    with ForwardRecorder(nn.Conv2d) as seen:
        summary = fit(cfg, run_dir(tmp_path)).summary
    first = [x for _, x, _, _ in seen.training() if x.shape[:2] == (8, 3)]
    assert first and all(x.dtype == torch.float32 for x in first)
    assert all(x.is_contiguous(memory_format=torch.channels_last) for x in first)
    assert all(x.min() < -0.5 and x.max() > 1.0 for x in first)  # normalised, not [0, 1]
    gears = summary["gears"]
    assert gears["data_batch_dtype"] == "uint8" and gears["num_workers"] == 2
    assert gears["decoder"] in JPEG_DECODERS and "auto: the fastest" in gears["decoder_reason"]


# ---------------------------------------------------------------- decoders


@pytest.mark.parametrize("size", [(40, 52), (70, 96)])  # (70, 96) at 16 px: DCT-scaled
def test_every_decoder_gives_the_pixels_pil_gives(tmp_path, size):
    pixels = photo(*size, cell=16, noise=1)  # smooth: every way of scaling down agrees
    Image.fromarray(pixels).save(tmp_path / "a.jpg", quality=92)
    reference = ImageDecoder("pil", 3, 16)(str(tmp_path / "a.jpg")).float()
    assert reference.shape == (3, 16, 16)
    for name in [n for n in JPEG_DECODERS if installed(n)]:
        image = ImageDecoder(name, 3, 16)(str(tmp_path / "a.jpg"))
        assert image.dtype == torch.uint8 and image.shape == (3, 16, 16), name
        # libjpeg builds differ by a level or two; DCT scaling (PIL's 1/4, simplejpeg's 3/8
        # for the larger image) is another low-pass filter than an antialiased resize
        assert (image.float() - reference).abs().mean() < (3 if size[0] < 64 else 8), name
        assert (image.float() - reference.flip(2)).abs().mean() > 10  # the bound means something
    for name in [n for n in JPEG_DECODERS if installed(n)]:
        gray = ImageDecoder(name, 1, 16)(str(tmp_path / "a.jpg"))
        assert gray.shape == (1, 16, 16), name


def test_auto_takes_the_decoder_measured_fastest_for_the_source_size(tmp_path, monkeypatch):
    for name, size in (("small", (20, 28)), ("large", (40, 52))):
        (tmp_path / name).mkdir()
        for i in range(3):
            Image.fromarray(photo(*size, seed=i)).save(tmp_path / name / f"{i}.jpg")
    files = {name: [str(p) for p in (tmp_path / name).iterdir()] for name in ("small", "large")}
    chosen = lambda name: choose_decoder("auto", files[name], 3, 16)[0].name  # noqa: E731
    if installed("simplejpeg"):
        assert chosen("small") == chosen("large") == "simplejpeg"
    monkeypatch.setattr(decode, "installed", lambda name: name != "simplejpeg")
    assert chosen("small") == "torchvision"  # under twice the training size: full decodes
    assert chosen("large") == "pil"  # 40 >= 2 x 16: PIL's draft mode decodes at 1/2
    _, reason = choose_decoder("auto", files["large"], 3, 16)
    assert reason.startswith("auto: the fastest for JPEGs of about 52x40 at 16 px")
    timings = time_decoders(files["small"], 3, 16, rounds=1)
    assert set(timings) == {"pil", "torchvision"} and min(timings.values()) > 0


def test_files_a_fast_decoder_refuses_are_decoded_by_pil(tmp_path):
    Image.fromarray(photo(20, 20)).convert("CMYK").save(tmp_path / "cmyk.jpg")
    Image.fromarray(photo(20, 20)).save(tmp_path / "png.jpg", format="PNG")  # misnamed
    for file, tolerance in (("cmyk.jpg", 2), ("png.jpg", 0)):
        reference = ImageDecoder("pil", 3, 16)(str(tmp_path / file)).int()
        for name in [n for n in JPEG_DECODERS if installed(n)]:
            image = ImageDecoder(name, 3, 16)(str(tmp_path / file))
            assert (image.int() - reference).abs().max() <= tolerance, (file, name)


def test_decoder_choices_are_checked(tmp_path):
    with pytest.raises(ConfigError, match=r"data\.decoder='fast' is not allowed; choose one of"):
        check_config(folder_cfg(tmp_path, "data.decoder=fast"))
    with pytest.raises(ConfigError, match=r"data\.batch_dtype='int8' is not allowed"):
        check_config(folder_cfg(tmp_path, "data.batch_dtype=int8"))
    message = "data.stage_format='jpeg' is not allowed; a resized copy needs data.stage_to"
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(folder_cfg(tmp_path, "data.stage_format=jpeg"))


# ---------------------------------------------------------------- staged resized copies


@pytest.mark.parametrize("stage_format", ["jpeg", "raw"])
def test_a_resized_copy_keeps_samples_and_pixels_and_follows_its_source(tmp_path, stage_format):
    write_photos(tmp_path / "images", per_class=5, size=(60, 80))
    local = tmp_path / "local"
    staged = (
        f"data.stage_to={local}", f"data.stage_format={stage_format}", "data.decoder=pil",
        "data.val_fraction=0.4",
    )  # fmt: skip
    plain_train, plain_val = data_batches(folder_cfg(tmp_path / "images", *staged[2:]), CPU)
    train, val = data_batches(folder_cfg(tmp_path / "images", *staged), CPU)
    assert train.dataset.samples == plain_train.dataset.samples  # labels, split, order
    assert val.dataset.samples == plain_val.dataset.samples
    copies = [p for p in local.iterdir() if p.is_dir()]
    assert len(copies) == 1 and not list(local.glob("*.tmp-*"))
    if stage_format == "raw":
        stored = np.load(copies[0] / RAW_FILE, mmap_mode="r")
        assert stored.shape == (15, 3, 16, 16)  # every image at the training size, one file
    else:
        assert len(list(copies[0].rglob("*.jpg"))) == 15
        assert Image.open(next(copies[0].rglob("*.jpg"))).size == (18, 18)  # 1.15 x 16
    for (a, la), (b, lb) in zip([*plain_train, *plain_val], [*train, *val], strict=True):
        assert torch.equal(la, lb) and b.dtype == torch.uint8
        # raw: the same pixels; jpeg: one more JPEG (q90, 4:4:4) and one more resize, at 18 px
        assert (a.float() - b.float()).abs().mean() < (1 if stage_format == "raw" else 8)
    assert "staged" in train.dataset.gears

    data_batches(folder_cfg(tmp_path / "images", *staged), CPU)  # reused, not made again
    assert len([p for p in local.iterdir() if p.is_dir()]) == 1
    data_batches(folder_cfg(tmp_path / "images", *staged, "data.image_size=12"), CPU)  # new size
    first = tmp_path / "images" / "c0" / "0.jpg"
    Image.fromarray(photo(60, 80, seed=99)).save(first)  # the source changed
    os.utime(first, ns=(1, 1))
    changed, _ = data_batches(folder_cfg(tmp_path / "images", *staged, "data.val_fraction=0"), CPU)
    assert len([p for p in local.iterdir() if p.is_dir()]) == 3
    index = [p for p, _ in changed.dataset.samples].index(str(first))
    fresh = ImageDecoder("pil", 3, 16)(str(first)).float()
    assert (changed.dataset[index][0].float() - fresh).abs().mean() < 8


def test_a_damaged_file_stops_staging_named_and_leaves_no_copy(tmp_path):
    write_photos(tmp_path / "images", per_class=3)
    whole = (tmp_path / "images" / "c1" / "0.jpg").read_bytes()
    damaged = tmp_path / "images" / "c1" / "damaged.jpg"
    damaged.write_bytes(whole[: len(whole) // 2])  # passes the header check
    cfg = folder_cfg(
        tmp_path / "images", f"data.stage_to={tmp_path / 'local'}", "data.stage_format=raw"
    )
    with pytest.raises(ConfigError, match=re.escape(f"{damaged}: image file is truncated")):
        data_batches(cfg, CPU)
    target = staged_path(tmp_path / "images", tmp_path / "local")
    assert [p.name for p in (tmp_path / "local").iterdir()] != [target.name]
    assert not [p for p in (tmp_path / "local").iterdir() if p.is_dir()]  # nothing half-written


# ---------------------------------------------------------------- resume and damage mid-epoch


@pytest.mark.parametrize(
    "reading",
    [(), ("data.stage_format=raw",), ("data.stage_format=jpeg", "dataloader.num_workers=2")],
    ids=["uint8", "staged-raw", "staged-jpeg-workers"],
)
def test_stop_mid_epoch_then_resume_equals_an_uninterrupted_run(tmp_path, reading):
    write_photos(tmp_path / "images", per_class=8)  # 24 images, 21 to train: 3 batches an epoch
    gears = (
        "model=simple_cnn", "max_steps=7", "data.augment=true", "device_transforms.hflip=true",
        "data.decoder=pil", f"data.stage_to={tmp_path / 'local'}", "data.val_fraction=0.1",
        *reading,
    )  # fmt: skip
    whole = fit(folder_cfg(tmp_path / "images", *gears), tmp_path / "whole")
    cfg = partial(folder_cfg, tmp_path / "images", *gears)
    saved, resumed = stop_and_resume(cfg, tmp_path / "stopped", step=4)
    assert saved["position"]["epoch"] == 1 and saved["position"]["epoch_samples"] == 8  # mid-epoch
    assert_same_parameters(resumed.model, whole.model)


def damage_one(images: Path) -> Path:
    whole = (images / "c2" / "0.jpg").read_bytes()
    damaged = images / "c2" / "zz-damaged.jpg"
    damaged.write_bytes(whole[: len(whole) // 2])  # a valid header, half the data
    return damaged


@pytest.mark.parametrize(
    "reading",
    [("data.decoder=simplejpeg" if installed("simplejpeg") else "data.decoder=torchvision",),
     ("data.batch_dtype=float32", "dataloader.num_workers=2")],
    ids=["uint8", "float32-workers"],  # data.decode=gpu's: tests/test_gpu_decode.py
)  # fmt: skip
def test_a_damaged_file_found_mid_epoch_is_named_after_a_checkpoint(tmp_path, reading):
    write_photos(tmp_path / "images", per_class=8)
    damaged = damage_one(tmp_path / "images")
    cfg = folder_cfg(
        tmp_path / "images", "model=simple_cnn", "data.val_fraction=0", "data.num_samples=null",
        "accum=2", "epochs=1", *reading,
    )  # fmt: skip
    checkpoint = stops_at_damaged_file(cfg, run_dir(tmp_path), damaged)
    position = load_checkpoint(checkpoint)["position"]
    # at an optimizer step (2 batches of 8): no accumulation window cut short
    assert position["epoch_samples"] % (2 * 8) == 0


def test_a_damaged_file_mid_epoch_ends_the_command_with_one_line(tmp_path):
    write_photos(tmp_path / "images", per_class=8)
    damaged = damage_one(tmp_path / "images")
    (tmp_path / "work").mkdir()
    result = run_train(
        "data=imagefolder", f"data.path={tmp_path / 'images'}", "data.num_classes=3",
        "data.image_size=16", "data.val_fraction=0", "model=simple_cnn", "batch_size=8",
        "epochs=1", "dataloader.num_workers=2", "logger=none", "progress_bar=false",
        cwd=tmp_path / "work",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: cannot decode image {damaged}: "), result.stderr
    assert "checkpoints" in last and list((tmp_path / "work").rglob("checkpoints/step_*"))


def test_unreadable_image_keeps_one_line_when_rebuilt_from_a_worker_traceback():
    worker = (
        "Caught UnreadableImage in DataLoader worker process 1.\nOriginal Traceback (most "
        'recent call last):\n  File "x.py", line 3, in f\n    raise UnreadableImage(...)\n'
        "gearshift.data.decode.UnreadableImage: cannot decode image /d/a.jpg: truncated\n"
    )
    assert str(UnreadableImage(worker)) == "cannot decode image /d/a.jpg: truncated"


# ---------------------------------------------------------------- make bench-data


@pytest.mark.slow  # 10 s: builds every row, staging included
def test_every_bench_data_row_ends_with_the_recipes_kind_of_batch(tmp_path, monkeypatch):
    """scripts/bench_data.py compares like with like: each loader's batches end up normalised
    float32 images of the same size, close to what the torchvision recipe makes."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import bench_data

    bench_data.write_folder(tmp_path / "images", 12, 3, (60, 60))
    args = SimpleNamespace(classes=3, size=32, batch=4, workers=0)
    monkeypatch.setattr(bench_data, "installed_hf", lambda: False)  # tests/test_hf_data.py
    monkeypatch.setenv("GEARSHIFT_CACHE", str(tmp_path / "cache"))
    rows = bench_data.configurations(tmp_path / "images", tmp_path / "stage", args, CPU)
    assert "torchvision recipe" in rows and "uint8, staged raw" in rows
    # data=shards' rows: tests/test_shards.py; data=hf's row: tests/test_hf_data.py
    assert_every_row_ends_with_the_recipes_kind_of_batch(bench_data, rows)


def assert_every_row_ends_with_the_recipes_kind_of_batch(bench_data, rows: dict) -> None:
    """Each of scripts/bench_data.py's `rows` (the torchvision recipe's first) makes
    normalised float32 images of the same size, close to the recipe's."""
    reference = None
    for name, build in rows.items():
        batches, place = build()
        images = place(next(iter(batches)))
        assert images.dtype == torch.float32 and images.shape == (4, 3, 32, 32), name
        assert images.min() > -2.2 and images.max() < 2.7, name  # ImageNet-normalised
        if reference is None:
            reference = images.mean().item()
        assert abs(images.mean().item() - reference) < 0.35, name  # other images, same kind
        assert bench_data.one_epoch(batches, place, CPU, 0) > 0
