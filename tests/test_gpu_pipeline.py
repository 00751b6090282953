"""The CUDA side of the performance gears: the side-stream prefetcher, batch_size=auto by
out-of-memory probing, MFU against the datasheet peak, and checkpointing. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch
from helpers import SyncCounter, make_cfg, task_of

from gearshift.batch_finder import find_batch_size
from gearshift.data.host_loader import build_loader
from gearshift.data.prefetch import CudaPrefetcher
from gearshift.data.synthetic import TensorPairs
from gearshift.observe.gpu_datasheets import gpu_peak
from gearshift.run_plan import planner
from train import fit

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def host_loader(pin_memory: str):
    cfg = make_cfg("device=cuda", f"dataloader.pin_memory={pin_memory}", "batch_size=8")
    images = torch.randn(64, 3, 8, 8)
    labels = torch.arange(64)
    dataset = TensorPairs(images, labels)
    return build_loader(dataset, cfg.dataloader, 8, CUDA, train=False, seed=0), images, labels


@pytest.mark.parametrize("pin_memory", ["true", "false"])
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_prefetcher_yields_every_batch_on_the_device_with_the_right_values(pin_memory, layout):
    loader, images, labels = host_loader(pin_memory)
    seen = []
    for batch_images, batch_labels in CudaPrefetcher(loader, CUDA, layout):
        assert batch_images.is_cuda and batch_labels.is_cuda
        assert batch_images.is_contiguous(memory_format=layout)
        # compute on the batch while the next copy is in flight, as the loop does
        seen.append(((batch_images * 2).cpu() / 2, batch_labels.cpu()))
    assert torch.equal(torch.cat([i for i, _ in seen]), images)
    assert torch.equal(torch.cat([lab for _, lab in seen]), labels)


def test_prefetched_batches_stay_intact_while_later_copies_run():
    loader, images, _ = host_loader("true")
    kept = []
    for batch_images, _ in CudaPrefetcher(loader, CUDA, torch.contiguous_format):
        torch.cuda._sleep(1_000_000)  # slow compute: copies of later batches overlap it
        kept.append(batch_images)
    assert torch.equal(torch.cat(kept).cpu(), images)


def test_prefetcher_copies_nested_inputs_and_marks_each_tensor():
    # inputs as (numeric, {"categorical": ...}): record_stream on each tensor, not on the tuple
    numeric, categorical = torch.randn(16, 3), torch.arange(32).view(16, 2)
    batches = [((numeric[i : i + 8], {"categorical": categorical[i : i + 8]}), torch.arange(8))
               for i in (0, 8)]  # fmt: skip
    seen = list(CudaPrefetcher(batches, CUDA, torch.contiguous_format))
    assert len(seen) == 2
    for (got_numeric, got), _ in seen:
        assert got_numeric.is_cuda and got["categorical"].is_cuda
    assert torch.equal(torch.cat([n for (n, _), _ in seen]).cpu(), numeric)
    assert torch.equal(torch.cat([c["categorical"] for (_, c), _ in seen]).cpu(), categorical)


def test_fit_with_prefetch_from_host_data_on_cuda(tmp_path, monkeypatch):
    cfg = make_cfg(
        "device=cuda",
        "model=mlp",
        "data.on_device=false",
        "dataloader=tuned",
        "dataloader.prefetch_to_device=true",
        "max_steps=20",
        "log_every_n_steps=10",
        "warmup_steps=5",
    )
    reads = SyncCounter(monkeypatch, cuda_only=True)
    result = fit(cfg, tmp_path)
    assert result.summary["gears"]["prefetch_to_device"] is True
    assert result.summary["steps"] == 20
    # still no host reads between log steps; + best/'s finite check (the end checkpoint is
    # best/)
    assert reads.count == 3 + 2 + 1


def test_batch_size_auto_on_cuda_is_a_multiple_of_8_within_the_memory_cap():
    cap_gib = 0.5
    cfg = make_cfg(
        "device=cuda",
        "model=resnet18",
        "data.image_size=64",
        "data.num_samples=100000",
        "batch_size=auto",
        f"batch_size_finder.max_memory_gib={cap_gib}",
    )
    before = torch.cuda.memory_allocated()
    nodes, task = (cfg.batch_size_finder, cfg.model, cfg.optimizer), task_of(cfg)
    choice = find_batch_size(
        *nodes, task, CUDA, None, torch.contiguous_format, 256, plan=planner(cfg, task)
    )
    assert choice.batch_size % 8 == 0 and choice.batch_size >= 8
    assert choice.bound == "memory_budget"
    # the probe is gone, and its peak does not count as the run's
    assert torch.cuda.memory_allocated() == before
    assert torch.cuda.max_memory_allocated() == before


def test_mfu_on_cuda_uses_the_datasheet_peak_where_the_device_is_listed(tmp_path):
    summary = fit(
        make_cfg("device=cuda", "model=resnet18", "amp=bf16", "max_steps=12"), tmp_path
    ).summary
    peak, _ = gpu_peak(torch.cuda.get_device_name(), "bfloat16")
    assert summary["peak_flops_per_sec"] == peak
    if peak is not None:
        assert summary["peak_flops_source"].startswith("datasheet:")
        assert 0 < summary["mfu"] < 1


def test_checkpointing_on_cuda_lowers_peak_memory(tmp_path):
    peaks = []
    for on in ("false", "true"):
        (tmp_path / on).mkdir()
        cfg = make_cfg(
            "device=cuda",
            "model=resnet18",
            "data.image_size=64",
            "batch_size=64",
            "max_steps=3",
            f"model.checkpointing={on}",
        )
        torch.cuda.reset_peak_memory_stats()
        peaks.append(fit(cfg, tmp_path / on).summary["peak_memory_bytes"])
    assert peaks[1] < peaks[0]
