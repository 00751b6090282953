"""data.decode=gpu (data/gpu_decode.py): workers read JPEG bytes, the device decodes, resizes
and normalises whole batches. Everything but nvJPEG itself is device-agnostic, so it is
checked here on a CPU (decode_jpeg decodes there too) against the host path's output for
the same files; the tests marked `gpu` check the CUDA path (scripts/gpu_check.sh)."""

from __future__ import annotations

import re
import threading
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import SyncCounter, make_cfg, seconds, stops_at_damaged_file
from PIL import Image
from test_checkpoint import assert_same_parameters, stop_and_resume
from test_datasets import folder_cfg, run_dir
from test_images_uint8 import damage_one, write_photos

from gearshift.config import ConfigError, check_config
from gearshift.data.decode import centre_square
from gearshift.data.device_transforms import DeviceTransforms
from gearshift.data.gpu_decode import (
    DamagedJpeg,
    DeviceDecodedBatches,
    JpegBatch,
    JpegFiles,
    collate_jpegs,
    file_kind,
    resize_crop,
)
from gearshift.data.loading import to_device
from gearshift.data.transforms_off import source_transforms
from gearshift.data_batches import data_batches
from gearshift.state.checkpoint_reads import load_checkpoint
from train import fit

CPU = torch.device("cpu")
COLOURS = [(220, 40, 40), (40, 200, 40), (40, 40, 220)]
SIZE = 16


def write_jpegs(root: Path, per_class: int, shapes=((40, 56), (48, 40), (40, 40))) -> None:
    """root/c<k>/<i>.jpg: class k's colour in a smooth ramp with a little noise, in several
    sizes (grouped and mixed batches), none of them the training size."""
    rng = np.random.default_rng(0)
    for k, colour in enumerate(COLOURS):
        (root / f"c{k}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            h, w = shapes[i % len(shapes)]
            ramp = np.linspace(0.6, 1.0, w)[None, :, None]  # left darker than right
            pixels = np.array(colour)[None, None, :] * ramp + rng.normal(0, 6, (h, w, 3))
            image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
            image.save(root / f"c{k}" / f"{i}.jpg", quality=95)


def jpeg_cfg(path: Path, decode: str, *overrides: str):
    return make_cfg(
        "device=cpu",
        "data=imagefolder",
        f"data.path={path}",
        "data.num_classes=3",
        f"data.image_size={SIZE}",
        "data.num_samples=null",
        "data.num_val_samples=null",
        "data.val_fraction=0.5",
        f"data.decode={decode}",
        "batch_size=6",
        *overrides,
    )


def model_inputs(
    cfg, batches, train: bool = False, device: torch.device = CPU
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """What the model sees of each batch: placed as the loop places it (to_device, then the device transforms)."""
    layout = torch.channels_last if cfg.memory_format.channels_last else torch.contiguous_format
    source = source_transforms(batches.dataset)  # the source's stage: augment, mean, std
    transforms = DeviceTransforms(cfg.device_transforms, device, layout, cfg.seed, source)
    placed = [to_device(batch, device, False, layout) for batch in batches]
    return [(transforms(images, train), labels) for images, labels in placed]


# ---------------------------------------------------------------- bytes and batches


def test_workers_hand_over_file_bytes_and_batches_keep_each_image_whole(tmp_path):
    write_jpegs(tmp_path, per_class=4)
    train, val = data_batches(jpeg_cfg(tmp_path, "gpu", "dataloader.num_workers=1"), CPU)
    assert isinstance(train.batches.dataset, JpegFiles)
    (encoded, path), label = train.batches.dataset[0]
    assert encoded.dtype == torch.uint8 and encoded.dim() == 1
    assert encoded.numpy().tobytes() == Path(path).read_bytes()
    assert label == train.batches.dataset.samples[0][1]

    # the collate: one buffer, split back into exactly the files' bytes, labels in order
    samples = [val.batches.dataset[i] for i in range(len(val.batches.dataset))]
    batch, labels = collate_jpegs(samples)
    assert isinstance(batch, JpegBatch) and batch.data.dim() == 1
    assert [b.numpy().tobytes() for b in batch.images()] == [
        Path(p).read_bytes() for p in batch.paths
    ]
    assert labels.tolist() == [label for _, label in samples]

    # a worker process gives the same batches as the main process
    _, in_process = data_batches(jpeg_cfg(tmp_path, "gpu"), CPU)
    for (a, la), (b, lb) in zip(in_process, val, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_resize_crop_groups_equal_shapes_and_matches_resizing_each_image():
    g = torch.Generator().manual_seed(0)
    images = [
        torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)
        for shape in ((3, 40, 56), (3, 48, 40), (3, 40, 56), (3, 16, 16), (3, 20, 20))
    ]
    batch = resize_crop(images, SIZE)
    assert batch.shape == (5, 3, SIZE, SIZE) and batch.dtype == torch.uint8
    for image, got in zip(images, batch, strict=True):
        assert torch.equal(got, centre_square(image, SIZE))  # the host path's resize
    assert torch.equal(batch[3], images[3])  # already the training size: untouched


# ---------------------------------------------------------------- against the host path


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("normalised", [False, True])
def test_device_decoding_gives_the_host_paths_batches(tmp_path, layout, normalised):
    write_jpegs(tmp_path, per_class=8)
    extra = [f"memory_format={layout}"]
    if not normalised:
        extra += ["data.mean=null", "data.std=null"]
    host_cfg, gpu_cfg = jpeg_cfg(tmp_path, "host", *extra), jpeg_cfg(tmp_path, "gpu", *extra)
    _, host_val = data_batches(host_cfg, CPU)
    _, gpu_val = data_batches(gpu_cfg, CPU)
    assert isinstance(gpu_val, DeviceDecodedBatches)
    for (h, _), (d, _) in zip(host_val, gpu_val, strict=True):  # what the copy moves
        assert h.dtype == d.dtype == torch.uint8 and h.shape == d.shape
    host = model_inputs(host_cfg, host_val)
    device = model_inputs(gpu_cfg, gpu_val)
    assert len(host) == len(device) == 2
    scale = 1 / 0.225 if normalised else 1.0  # ImageNet's std: errors grow by ~1/std
    for (h, hl), (d, dl) in zip(host, device, strict=True):
        assert d.shape == h.shape == (6, 3, SIZE, SIZE)
        assert d.dtype == h.dtype == torch.float32
        assert d.stride() == h.stride()
        assert torch.equal(dl, hl)
        # PIL decodes at a reduced DCT scale, nvJPEG/libjpeg at full size: close, not equal
        assert (d - h).abs().mean() < 0.01 * scale
        channel_means = (d.mean(dim=(2, 3)) - h.mean(dim=(2, 3))).abs()
        assert channel_means.max() < 0.005 * scale
        left, right = d[..., : SIZE // 2].mean(), d[..., SIZE // 2 :].mean()
        assert left < right  # the ramp kept its direction: no flip, no transposition


def test_grayscale_decodes_to_one_channel(tmp_path):
    write_jpegs(tmp_path, per_class=2)
    cfg = jpeg_cfg(tmp_path, "gpu", "data.channels=1", "data.mean=[0.5]", "data.std=[0.5]")
    _, val = data_batches(cfg, CPU)
    images, _ = model_inputs(cfg, val)[0]
    assert images.shape == (3, 1, SIZE, SIZE)
    assert images.min() >= -1 and images.max() <= 1


def test_augment_crops_and_flips_training_batches_only(tmp_path):
    write_jpegs(tmp_path, per_class=8)
    cfg = jpeg_cfg(tmp_path, "gpu", "data.augment=true", "data.mean=null", "data.std=null")
    plain_cfg = jpeg_cfg(tmp_path, "gpu", "data.mean=null", "data.std=null")
    train, val = data_batches(cfg, CPU)
    plain_train, plain_val = data_batches(plain_cfg, CPU)
    train.set_epoch(0), plain_train.set_epoch(0)
    augmented, _ = model_inputs(cfg, train, train=True)[0]
    plain, _ = model_inputs(plain_cfg, plain_train, train=True)[0]
    assert augmented.shape == plain.shape
    assert not torch.equal(augmented, plain)
    padded = (augmented == 0).all(dim=1).any(dim=(1, 2))  # a zero row or column: shifted
    flipped = augmented[..., :4].mean(dim=(1, 2, 3)) > augmented[..., -4:].mean(dim=(1, 2, 3))
    assert padded.any() and flipped.any() and not flipped.all()  # the ramp reversed in some
    validation = zip(model_inputs(cfg, val), model_inputs(plain_cfg, plain_val), strict=True)
    for (a, _), (b, _) in validation:
        assert torch.equal(a, b)  # validation is never augmented


def test_starting_mid_epoch_yields_the_rest_of_that_epoch(tmp_path):
    write_jpegs(tmp_path, per_class=8)
    train, _ = data_batches(jpeg_cfg(tmp_path, "gpu", "data.val_fraction=0"), CPU)
    train.set_epoch(1)
    whole = list(train)
    train.set_epoch(1, start=2 * 6)  # after two batches of 6
    rest = list(train)
    assert len(whole) == 4 and len(rest) == 2
    for (a, la), (b, lb) in zip(whole[2:], rest, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_fit_trains_on_device_decoded_batches(tmp_path):
    write_jpegs(tmp_path / "images", per_class=8)
    cfg = jpeg_cfg(tmp_path / "images", "gpu", "model=simple_cnn", "max_steps=4")
    summary = fit(cfg, tmp_path / "run").summary  # fit itself: the preflight refuses a CPU
    assert summary["gears"]["data_decode"] == "gpu"
    assert summary["steps"] == 4 and summary["samples"] == 4 * 6
    assert np.isfinite(summary["final_loss"]) and summary["val_accuracy"] is not None


def test_stop_mid_epoch_then_resume_equals_an_uninterrupted_run(tmp_path):
    write_jpegs(tmp_path / "images", per_class=8)  # 12 to train: 2 batches an epoch
    gears = ("model=simple_cnn", "max_steps=5", "data.augment=true", "data.num_val_samples=0")
    whole = fit(jpeg_cfg(tmp_path / "images", "gpu", *gears), tmp_path / "whole")
    cfg = partial(jpeg_cfg, tmp_path / "images", "gpu", *gears)
    saved, resumed = stop_and_resume(cfg, tmp_path / "stopped", step=3)
    assert saved["position"]["epoch"] == 1 and saved["position"]["epoch_samples"] == 6  # mid-epoch
    assert_same_parameters(resumed.model, whole.model)  # same batches, same augmentation


def test_a_damaged_jpeg_found_mid_epoch_is_named_after_a_checkpoint(tmp_path):
    write_jpegs(tmp_path / "images", per_class=8)
    whole = (tmp_path / "images" / "c1" / "0.jpg").read_bytes()
    damaged = tmp_path / "images" / "c1" / "damaged.jpg"
    damaged.write_bytes(whole[:200] + bytes(range(256)) * 2)
    cfg = jpeg_cfg(
        tmp_path / "images", "gpu", "model=simple_cnn", "data.val_fraction=0", "epochs=1"
    )
    stops_at_damaged_file(cfg, tmp_path / "run", damaged)


def test_a_damaged_jpeg_found_mid_epoch_stops_the_run_at_an_optimizer_step(tmp_path):
    # the host decoders' case (tests/test_images_uint8.py) with the device decoding
    write_photos(tmp_path / "images", per_class=8)
    damaged = damage_one(tmp_path / "images")
    cfg = folder_cfg(
        tmp_path / "images", "model=simple_cnn", "data.val_fraction=0", "data.num_samples=null",
        "accum=2", "epochs=1", "data.decode=gpu",
    )  # fmt: skip
    checkpoint = stops_at_damaged_file(cfg, run_dir(tmp_path), damaged)
    position = load_checkpoint(checkpoint)["position"]
    # at an optimizer step (2 batches of 8): no accumulation window cut short
    assert position["epoch_samples"] % (2 * 8) == 0


def test_the_decoding_thread_keeps_order_hands_errors_over_in_place_and_ends_with_the_loop(
    tmp_path,
):
    write_jpegs(tmp_path, per_class=2)
    paths = sorted(str(p) for p in tmp_path.glob("c*/*.jpg"))
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(Path(paths[0]).read_bytes()[:200] + bytes(range(256)) * 2)
    dataset = JpegFiles([(p, i) for i, p in enumerate(paths)], ["c0"], SIZE, 3, None, False)

    def batch(files: list[str], first_label: int):
        samples = [
            (
                (torch.frombuffer(bytearray(Path(f).read_bytes()), dtype=torch.uint8), f),
                first_label + i,
            )
            for i, f in enumerate(files)
        ]
        return collate_jpegs(samples)

    good = [batch(paths[i : i + 2], i) for i in range(0, 6, 2)]
    decoded = DeviceDecodedBatches(good, dataset, CPU, torch.contiguous_format, False)
    assert [labels.tolist() for _, labels in decoded] == [[0, 1], [2, 3], [4, 5]]  # in order

    def decoding_threads() -> int:
        return sum(t.name == "jpeg-decode" and t.is_alive() for t in threading.enumerate())

    with_error = [good[0], good[1], batch([paths[4], str(broken)], 4), good[2]]
    seen = []
    with pytest.raises(DamagedJpeg, match=re.escape(f"cannot decode image {broken}: ")):
        for _, labels in DeviceDecodedBatches(
            with_error, dataset, CPU, torch.contiguous_format, False
        ):
            seen.append(labels.tolist())
    assert seen == [[0, 1], [2, 3]]  # the batches before the damaged one, then its error
    assert decoding_threads() == 0

    taken = []

    def source():
        for i, b in enumerate(good * 4):
            taken.append(i)
            yield b

    iterator = iter(DeviceDecodedBatches(source(), dataset, CPU, torch.contiguous_format, False))
    next(iterator)
    deadline = time.monotonic() + seconds(10)
    while len(taken) < 1 + DeviceDecodedBatches.AHEAD and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    # decoded ahead while the loop holds batch 0: AHEAD queued, one more waiting for room
    assert 1 + DeviceDecodedBatches.AHEAD <= len(taken) <= 2 + DeviceDecodedBatches.AHEAD
    iterator.close()  # the loop stops early (max_steps): the thread stops too
    assert decoding_threads() == 0 and len(taken) < 12


# ---------------------------------------------------------------- bad input


def test_file_kind_reads_the_magic_bytes(tmp_path):
    write_jpegs(tmp_path, per_class=1)
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    (tmp_path / "page.jpg").write_text("<html>not found</html>")
    (tmp_path / "empty.jpg").write_bytes(b"")
    assert file_kind(str(tmp_path / "c0" / "0.jpg")) is None
    assert file_kind(str(tmp_path / "a.png")) == "a PNG file, not a JPEG"
    assert file_kind(str(tmp_path / "page.jpg")) == "not a JPEG file"
    assert file_kind(str(tmp_path / "empty.jpg")) == "empty, not a JPEG"


def test_a_non_jpeg_stops_the_run_at_start_naming_it(tmp_path):
    write_jpegs(tmp_path, per_class=3)
    png = tmp_path / "c1" / "extra.png"
    Image.new("RGB", (20, 20), COLOURS[1]).save(png)
    message = (
        f"data.decode='gpu' is not allowed; {png} is a PNG file, not a JPEG, and the device "
        "decodes JPEGs only; convert it or use data.decode=host"
    )
    with pytest.raises(ConfigError, match=re.escape(message)):
        data_batches(jpeg_cfg(tmp_path, "gpu"), CPU)
    data_batches(jpeg_cfg(tmp_path, "host"), CPU)  # the host path reads PNGs


def test_a_damaged_jpeg_is_named_when_its_batch_decodes(tmp_path):
    write_jpegs(tmp_path, per_class=4)
    whole = (tmp_path / "c2" / "0.jpg").read_bytes()
    damaged = tmp_path / "c2" / "damaged.jpg"
    damaged.write_bytes(whole[:200] + bytes(range(256)) * 2)  # a JPEG header, broken data
    cfg = jpeg_cfg(tmp_path, "gpu", "data.check_images=header", "data.val_fraction=0")
    train, _ = data_batches(cfg, CPU)  # the header and magic-bytes checks pass it
    train.set_epoch(0)
    with pytest.raises(DamagedJpeg, match=re.escape(f"cannot decode image {damaged}: ")) as error:
        list(train)
    assert error.value.path == str(damaged)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("data.decode=maybe",), "data.decode='maybe' is not allowed; choose one of: host, gpu"),
        (
            ("data.decode=gpu",),
            "data.decode='gpu' is not allowed; it decodes JPEGs on a CUDA device and this run "
            "trains on the CPU; use data.decode=host",
        ),
        (
            ("data.decode=gpu", "device=auto", "data.stage_to=LOCAL", "data.stage_format=raw"),
            "data.decode='gpu' is not allowed; data.stage_format=raw stores decoded pixels, "
            "nothing is left to decode",
        ),
    ],
)
def test_check_config_refuses_bad_decode_values(tmp_path, monkeypatch, overrides, message):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: "device=auto" in overrides)
    write_jpegs(tmp_path / "images", per_class=1)
    local = str(tmp_path / "local")
    cfg = jpeg_cfg(tmp_path / "images", "host", *(o.replace("LOCAL", local) for o in overrides))
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(cfg)


def test_the_device_decodes_a_resized_jpeg_copy_of_any_source(tmp_path):
    """data.stage_format=jpeg: the copy is JPEG whatever the source (a PNG here), and the
    device's batches match the host's reading the same copy."""
    write_jpegs(tmp_path / "images", per_class=8)
    Image.new("RGB", (40, 44), COLOURS[2]).save(tmp_path / "images" / "c2" / "extra.png")
    staged = (f"data.stage_to={tmp_path / 'local'}", "data.stage_format=jpeg")
    gpu_cfg = jpeg_cfg(tmp_path / "images", "gpu", *staged)
    host_cfg = jpeg_cfg(tmp_path / "images", "host", *staged, "data.decoder=pil")
    _, gpu_val = data_batches(gpu_cfg, CPU)
    _, host_val = data_batches(host_cfg, CPU)
    files = [path for path, _ in gpu_val.dataset.samples]
    assert all(Path(f).is_relative_to(tmp_path / "local") and f.endswith(".jpg") for f in files)
    for (h, hl), (d, dl) in zip(
        model_inputs(host_cfg, host_val), model_inputs(gpu_cfg, gpu_val), strict=True
    ):
        assert d.shape == h.shape and d.dtype == h.dtype and torch.equal(dl, hl)
        # the same small JPEGs, both through libjpeg-turbo here: equal up to the IDCT
        assert (d - h).abs().mean() < 0.005 / 0.225  # normalised by ImageNet's std


# ---------------------------------------------------------------- CUDA

CUDA = torch.device("cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_cuda_decoding_gives_the_host_batches_within_tolerance(tmp_path, layout):
    """nvJPEG against the host path (the host's decoder in the workers) and against
    decode_jpeg on the CPU, in what the model sees: equal shapes, dtypes, strides and labels;
    mean absolute difference under 0.02 of the [0, 1] range per batch and per-channel means
    within 0.02 of the host's (which may decode at a reduced DCT scale), and a mean
    absolute difference under 0.01 from the CPU decoder (nvJPEG's own IDCT and upsampling)."""
    write_jpegs(tmp_path, per_class=8)
    extra = ("data.mean=null", "data.std=null", f"memory_format={layout}")
    host_cfg = jpeg_cfg(tmp_path, "host", *extra)
    cuda_cfg = jpeg_cfg(tmp_path, "gpu", *extra, "device=cuda")
    check_config(cuda_cfg)  # allowed where CUDA is
    _, host_val = data_batches(host_cfg, CPU)
    _, cpu_val = data_batches(jpeg_cfg(tmp_path, "gpu", *extra), CPU)
    _, cuda_val = data_batches(cuda_cfg, CUDA)
    batches = zip(
        model_inputs(host_cfg, host_val),
        model_inputs(host_cfg, cpu_val),
        model_inputs(cuda_cfg, cuda_val, device=CUDA),
        strict=True,
    )
    for (h, hl), (c, _), (d, dl) in batches:
        assert d.is_cuda and dl.is_cuda
        assert d.shape == h.shape and d.dtype == h.dtype and d.stride() == h.stride()
        d, dl = d.cpu(), dl.cpu()
        assert torch.equal(dl, hl)
        assert (d - h).abs().mean() < 0.02
        assert (d.mean(dim=(2, 3)) - h.mean(dim=(2, 3))).abs().max() < 0.02
        assert (d - c).abs().mean() < 0.01


@pytest.mark.gpu
def test_cuda_damaged_jpeg_is_named(tmp_path):
    write_jpegs(tmp_path, per_class=4)
    damaged = tmp_path / "c0" / "damaged.jpg"
    damaged.write_bytes((tmp_path / "c0" / "1.jpg").read_bytes()[:200] + bytes(range(256)) * 2)
    train, _ = data_batches(jpeg_cfg(tmp_path, "gpu", "device=cuda", "data.val_fraction=0"), CUDA)
    with pytest.raises(DamagedJpeg, match=re.escape(f"cannot decode image {damaged}")):
        list(train)


@pytest.mark.gpu
def test_cuda_fit_with_device_decoding_reads_the_device_no_more_than_host_decoding(
    tmp_path, monkeypatch
):
    write_jpegs(tmp_path / "images", per_class=16)
    reads, counts = SyncCounter(monkeypatch, cuda_only=True), {}
    for decode in ("host", "gpu"):
        cfg = jpeg_cfg(
            tmp_path / "images",
            decode,
            "device=cuda",
            "model=resnet18",
            "dataloader=tuned",
            "memory_format=channels_last",
            "data.augment=true",
            "max_steps=12",
            "log_every_n_steps=6",
            "warmup_steps=2",
        )
        reads.count = 0
        summary = fit(cfg, tmp_path / decode).summary
        counts[decode] = reads.count
        assert summary["gears"]["data_decode"] == decode
        assert summary["steps"] == 12 and 0 <= summary["data_wait_pct"] <= 100
    assert counts["gpu"] == counts["host"]  # decoding on the device adds no host reads
