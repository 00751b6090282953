"""The input pipeline on the device (prefetcher, transforms) and activation checkpointing."""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn.functional as F
import torchvision
from helpers import ForwardRecorder, load_script, make_cfg
from torch import nn

from gearshift.batch_finder import TensorMemory
from gearshift.build import build_data
from gearshift.config import ConfigError, check_config
from gearshift.data.device_transforms import DeviceTransforms
from gearshift.data.host_loader import LoaderBatches
from gearshift.data.loading import to_device
from gearshift.data.prefetch import batch_tensors
from gearshift.data.sources import build_datasets
from gearshift.data.transforms_off import Untransformed, build_transforms
from gearshift.models import SimpleCNN
from gearshift.models.recompute import CheckpointedSequential, apply_activation_checkpointing
from gearshift.parallel.distributed import Ranks
from train import fit

CPU = torch.device("cpu")

# -- prefetch_to_device ---------------------------------------------------------------------


def test_prefetch_on_cpu_passes_the_batches_through_untouched():
    cfg = make_cfg("data.on_device=false", "dataloader.prefetch_to_device=true")
    train_set, val_set = build_datasets(cfg.data, CPU)
    train, val, gears = build_data(
        cfg, cfg.batch_size, train_set, val_set, CPU, Ranks(), torch.contiguous_format
    )
    assert isinstance(train, LoaderBatches) and isinstance(val, LoaderBatches)
    assert gears["prefetch_to_device"] is False


def test_prefetch_on_cpu_trains_exactly_as_without_it(tmp_path):
    results = []
    for prefetch in ("false", "true"):
        cfg = make_cfg(
            "model=mlp",
            "max_steps=5",
            "data.on_device=false",
            f"dataloader.prefetch_to_device={prefetch}",
        )
        (tmp_path / prefetch).mkdir()
        results.append(fit(cfg, tmp_path / prefetch))
    off, on = results
    for a, b in zip(off.model.parameters(), on.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert off.summary["final_loss"] == on.summary["final_loss"]
    assert on.summary["gears"]["prefetch_to_device"] is False  # nothing to overlap on a CPU


def test_the_prefetcher_finds_every_tensor_of_nested_inputs():
    # CudaPrefetcher marks each tensor batch_tensors finds in the batch to_device copied
    # (record_stream); the same copy and walk on a CPU, where the copy is the tensor itself
    numeric, categorical, mask = torch.randn(4, 3), torch.arange(8).view(4, 2), torch.ones(4)
    targets = torch.arange(4)
    batch = ((numeric, {"categorical": categorical, "extra": [mask, 7]}), targets)
    found = batch_tensors(to_device(batch, CPU, False, torch.contiguous_format))
    assert len(found) == 4  # not the number 7, not the tuple or the dict
    assert all(a is b for a, b in zip(found, (numeric, categorical, mask, targets), strict=True))
    pair = batch_tensors((numeric, targets))
    assert len(pair) == 2 and pair[0] is numeric and pair[1] is targets


# -- device transforms ----------------------------------------------------------------------


def transforms(*overrides: str, memory_format=torch.contiguous_format) -> DeviceTransforms:
    cfg = make_cfg(*overrides)
    return DeviceTransforms(cfg.device_transforms, CPU, memory_format, seed=0)


def test_transforms_off_hand_the_images_back_as_they_are():
    images = torch.randn(4, 3, 8, 8)
    assert transforms()(images, train=True) is images


class WithStage:
    """A source that left a transform to the device (as the uint8 image sources do)."""

    def __init__(self) -> None:
        self.device_transforms = {"normalize": False, "hflip": True}


def test_transforms_off_hand_batches_back_and_still_turn_uint8_images_into_floats():
    off = make_cfg().device_transforms
    layout = torch.channels_last
    untransformed = build_transforms(off, CPU, layout, 0, dataset=None)
    assert isinstance(untransformed, Untransformed)
    pair = (torch.randn(4, 3, 8, 8), torch.zeros(4))
    assert untransformed.on_batch(pair, train=True) is pair
    assert untransformed.scaling is None  # nothing to scale: DeviceTransforms not made
    raw = {"x": torch.full((2, 3, 4, 4), 255, dtype=torch.uint8), "y": torch.zeros(2)}
    placed = untransformed.on_batch(raw, train=True)  # a source of one's own serving bytes
    assert torch.equal(placed["x"], torch.ones(2, 3, 4, 4)) and placed["y"] is raw["y"]
    assert placed["x"].is_contiguous(memory_format=layout)
    on = make_cfg("device_transforms.normalize=true").device_transforms
    assert isinstance(build_transforms(on, CPU, layout, 0, dataset=None), DeviceTransforms)
    assert isinstance(build_transforms(off, CPU, layout, 0, WithStage()), DeviceTransforms)


def test_normalize_uses_the_per_channel_mean_and_std():
    t = transforms(
        "device_transforms.normalize=true",
        "device_transforms.mean=[0.5,0.0,-1.0]",
        "device_transforms.std=[0.5,2.0,1.0]",
    )
    images = torch.ones(2, 3, 4, 4)
    out = t(images, train=False)
    assert out[:, 0].eq(1.0).all() and out[:, 1].eq(0.5).all() and out[:, 2].eq(2.0).all()


def test_hflip_mirrors_about_half_the_training_samples_and_no_validation_sample():
    t = transforms("device_transforms.hflip=true")
    images = torch.randn(200, 3, 4, 4)
    out = t(images, train=True)
    same = (out == images).flatten(1).all(1)
    mirrored = (out == images.flip(3)).flatten(1).all(1)
    assert (same | mirrored).all() and 60 < mirrored.sum() < 140
    assert torch.equal(t(images, train=False), images)


def test_random_crop_takes_a_window_of_the_zero_padded_image():
    t = transforms("device_transforms.crop_padding=2")
    images = torch.randn(64, 3, 6, 6)
    out = t(images, train=True)
    padded = F.pad(images, (2, 2, 2, 2))
    offsets = set()
    for i in range(len(images)):
        windows = [
            (dy, dx)
            for dy in range(5)
            for dx in range(5)
            if torch.equal(out[i], padded[i, :, dy : dy + 6, dx : dx + 6])
        ]
        assert windows, f"sample {i} is no window of its padded image"
        offsets.add(windows[0])
    assert len(offsets) > 5  # the offsets vary from sample to sample


def test_transforms_keep_the_channels_last_layout_and_turn_uint8_into_floats():
    t = transforms("device_transforms.hflip=true", memory_format=torch.channels_last)
    images = torch.randn(4, 3, 8, 8).contiguous(memory_format=torch.channels_last)
    assert t(images, train=True).is_contiguous(memory_format=torch.channels_last)
    raw = torch.full((2, 3, 4, 4), 255, dtype=torch.uint8)
    assert torch.equal(transforms()(raw, train=False), torch.ones(2, 3, 4, 4))


def test_fit_feeds_the_model_normalised_images(tmp_path):
    cfg = make_cfg(
        "model=simple_cnn",
        "max_steps=2",
        "device_transforms.normalize=true",
        "device_transforms.mean=[100.0]",
        "device_transforms.std=[10.0]",
        "device_transforms.hflip=true",
    )
    with ForwardRecorder(nn.Conv2d) as seen:
        result = fit(cfg, tmp_path)
    # the run's batches (16 samples; the FLOP count's 2-sample probe is no batch of the run)
    inputs = [x for _, x, _, _ in seen.training() if x.shape[:2] == (16, 3)]
    assert inputs and all(x.mean() < -9 for x in inputs)  # (x - 100) / 10
    assert result.summary["gears"]["device_transforms"] == "normalize+hflip"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("device_transforms.mean=[0.1,0.2]", "expected one value or one per channel (3)"),
        ("device_transforms.std=[0.0]", "device_transforms.std=[0.0] is not allowed"),
        ("device_transforms.crop_padding=-1", "device_transforms.crop_padding=-1"),
    ],
)
def test_bad_transform_values_fail_in_one_line(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(make_cfg(override))


# -- activation checkpointing ---------------------------------------------------------------


def models():
    yield "simple_cnn", lambda: SimpleCNN(3, 10, width=8), "0"
    yield "resnet18", lambda: torchvision.models.resnet18(num_classes=10), "layer1.0"


def one_step(model: nn.Module, images, labels) -> None:
    F.cross_entropy(model(images), labels).backward()


@pytest.mark.parametrize(("name", "make", "block"), list(models()))
def test_checkpointing_gives_the_same_gradients_and_recomputes(name, make, block):
    torch.manual_seed(0)
    plain = make()
    checkpointed = apply_activation_checkpointing(copy.deepcopy(plain))
    assert any(isinstance(m, CheckpointedSequential) for m in checkpointed.modules())
    assert plain.state_dict().keys() == checkpointed.state_dict().keys()
    images, labels = torch.randn(4, 3, 16, 16), torch.randint(10, (4,))
    calls = {}
    for label, model in (("plain", plain), ("checkpointed", checkpointed)):
        calls[label] = 0

        def count(module, args, label=label):
            calls[label] += 1

        model.get_submodule(block).register_forward_pre_hook(count)
        one_step(model, images, labels)
    assert calls == {"plain": 1, "checkpointed": 2}  # the forward, then its recomputation
    for (n, a), (_, b) in zip(
        plain.named_parameters(), checkpointed.named_parameters(), strict=True
    ):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=n)
    for (n, a), (_, b) in zip(plain.named_buffers(), checkpointed.named_buffers(), strict=True):
        assert torch.equal(a, b), f"{n}: the recomputation updated BatchNorm twice"


def test_checkpointing_keeps_fewer_activations_for_the_backward_pass():
    torch.manual_seed(0)
    plain = torchvision.models.resnet18(num_classes=10)
    checkpointed = apply_activation_checkpointing(copy.deepcopy(plain))
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(10, (8,))
    peaks = []
    for model in (plain, checkpointed):
        with TensorMemory() as memory:
            loss = F.cross_entropy(model(images), labels)
            held_for_backward = memory.current
            loss.backward()
        peaks.append(held_for_backward)
    assert peaks[1] < 0.6 * peaks[0]  # the stem before layer1 is no block: it keeps its own


def test_model_checkpointing_gear_trains_like_the_plain_model(tmp_path):
    results = []
    for on in ("false", "true"):
        (tmp_path / on).mkdir()
        cfg = make_cfg("model=simple_cnn", "max_steps=3", f"model.checkpointing={on}")
        results.append(fit(cfg, tmp_path / on))
    plain, checkpointed = results
    assert checkpointed.summary["gears"]["checkpointing"] is True
    assert isinstance(checkpointed.model, CheckpointedSequential)
    for a, b in zip(plain.model.parameters(), checkpointed.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert plain.summary["final_loss"] == pytest.approx(checkpointed.summary["final_loss"])


def test_validation_runs_the_checkpointed_model_without_recomputing(tmp_path):
    model = apply_activation_checkpointing(SimpleCNN(3, 10, width=8))
    calls = []
    model[0].register_forward_pre_hook(lambda m, a: calls.append(torch.is_grad_enabled()))
    with torch.inference_mode():
        model.eval()(torch.randn(2, 3, 8, 8))
    assert calls == [False]


@pytest.mark.slow
def test_checkpointing_under_torch_compile_matches_eager():
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    plain = SimpleCNN(3, 10, width=8)
    compiled = torch.compile(apply_activation_checkpointing(copy.deepcopy(plain)))
    images, labels = torch.randn(4, 3, 8, 8), torch.randint(10, (4,))
    one_step(plain, images, labels)
    one_step(compiled, images, labels)
    for (n, a), (_, b) in zip(plain.named_parameters(), compiled.named_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5, msg=n)
    for (n, a), (_, b) in zip(plain.named_buffers(), compiled.named_buffers(), strict=True):
        torch.testing.assert_close(a, b, msg=n)  # BatchNorm updated once under compile too


def test_the_report_names_the_new_gears_in_a_sweep(tmp_path):
    report = load_script("report")
    (tmp_path / ".hydra").mkdir()
    overrides = ["model=resnet50", "batch_size=auto", "model.checkpointing=true", "max_steps=30"]
    overrides += ["data.on_device=false", "data.image_size=224"]
    (tmp_path / ".hydra" / "overrides.yaml").write_text("\n".join(f"- {o}" for o in overrides))
    assert report.gear_overrides(tmp_path) == [
        "batch_size=auto",
        "model.checkpointing=true",
        "data.on_device=false",
    ]
