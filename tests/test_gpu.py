"""The CUDA paths: fp16 + GradScaler, bf16, channels_last, pinned non-blocking copies,
compile, peak CUDA memory and CUDA-event step times. Skipped where no GPU is present."""

from __future__ import annotations

import pytest
import torch
from helpers import ForwardRecorder, SyncCounter, check_summary, make_cfg
from torch import nn

from gearshift.data.host_loader import build_loader
from gearshift.data.synthetic import TensorPairs
from train import fit

pytestmark = pytest.mark.gpu


def test_fp16_with_grad_scaler_trains_on_cuda(tmp_path):
    with ForwardRecorder(nn.Linear) as seen:
        result = fit(make_cfg("device=cuda", "model=mlp", "amp=fp16", "max_steps=12"), tmp_path)
    assert {out.dtype for _, _, out, _ in seen.training()} == {torch.float16}
    summary = result.summary
    assert summary["gears"]["grad_scaler"] is True
    check_summary(summary, steps=12, samples=12 * 16)
    assert summary["peak_memory_kind"] == "cuda_allocated"


def test_amp_on_is_bf16_on_a_gpu_that_supports_it(tmp_path):
    result = fit(make_cfg("device=cuda", "model=mlp", "amp=on", "max_steps=3"), tmp_path)
    want = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    assert result.summary["gears"]["amp"] == want


def test_data_parallel_trains_on_cuda(tmp_path):
    # where CUDA is, distributed=dp is allowed (without it: one error line, test_distributed.py)
    result = fit(make_cfg("device=cuda", "model=mlp", "distributed=dp", "max_steps=3"), tmp_path)
    assert isinstance(result.model, nn.Module) and result.summary["gears"]["distributed"] == "dp"
    check_summary(result.summary, steps=3, samples=3 * 16)


def test_channels_last_on_cuda(tmp_path):
    with ForwardRecorder(nn.Conv2d) as seen:
        fit(
            make_cfg(
                "device=cuda", "model=simple_cnn", "memory_format=channels_last", "max_steps=2"
            ),
            tmp_path,
        )
    _, images, _, _ = seen.training()[0]
    assert images.is_cuda and images.is_contiguous(memory_format=torch.channels_last)


def test_tuned_loader_pins_host_batches_for_cuda():
    cfg = make_cfg("device=cuda", "dataloader=tuned")
    dataset = TensorPairs(torch.randn(64, 3, 8, 8), torch.zeros(64, dtype=torch.long))
    images, _ = next(
        iter(build_loader(dataset, cfg.dataloader, cfg.batch_size, torch.device("cuda"), True, 0))
    )
    assert images.is_pinned()


def test_host_data_with_tuned_loader_trains_on_cuda(tmp_path):
    cfg = make_cfg(
        "device=cuda", "model=mlp", "data.on_device=false", "dataloader=tuned", "max_steps=8"
    )
    result = fit(cfg, tmp_path)
    assert result.summary["gears"]["pin_memory"] is True and result.summary["steps"] == 8


def test_compile_on_cuda(tmp_path):
    result = fit(make_cfg("device=cuda", "model=mlp", "compile=on", "max_steps=8"), tmp_path)
    assert result.summary["gears"]["compile"] == "default" and result.summary["step_time_ms"] > 0


def test_cuda_loop_reads_the_device_only_at_log_steps(tmp_path, monkeypatch):
    cfg = make_cfg(
        "device=cuda", "model=mlp", "max_steps=20", "log_every_n_steps=10", "warmup_steps=5"
    )
    reads = SyncCounter(monkeypatch, cuda_only=True)
    fit(cfg, tmp_path)
    assert reads.count == 3 + 2 + 1  # + best/'s finite check (the end checkpoint is best/)
