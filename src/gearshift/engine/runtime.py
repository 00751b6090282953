"""Process-wide set-up: the device, seeds, determinism, backend switches (docs/gears.md:
tip 15 cudnn.benchmark, TF32, deterministic)."""

from __future__ import annotations

import logging
import os
import random

import numpy as np
import torch

log = logging.getLogger(__name__)


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """auto: CUDA when present, else CPU; a bare "cuda" is this rank's local device."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)
    return device


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA device too


def deterministic_on(choice: bool | str) -> bool:
    """The `deterministic` key: false, true, or warn (on, but an op without a deterministic
    kernel warns instead of raising)."""
    return choice in (True, "warn")


def want_cublas_workspace(deterministic: bool | str) -> None:
    """Set CUBLAS_WORKSPACE_CONFIG (unless the user did): cuBLAS reads it when it starts,
    so this must run before the process's first matmul on CUDA."""
    if deterministic_on(deterministic):
        # cuBLAS is deterministic only with a fixed workspace (CUDA >= 10.2); PyTorch raises
        # for cuBLAS calls under use_deterministic_algorithms without one of its two settings.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def configure_determinism(deterministic: bool | str) -> None:
    """Only deterministic kernels (an op without one raises, naming itself; under warn it
    warns and runs) and cuDNN's deterministic algorithms. Switched off again when not
    asked for: a sweep's runs share the process."""
    on = deterministic_on(deterministic)
    want_cublas_workspace(deterministic)
    torch.use_deterministic_algorithms(on, warn_only=deterministic == "warn")
    torch.backends.cudnn.deterministic = on


def configure_backends(
    device: torch.device,
    cudnn_benchmark: bool,
    matmul_precision: str,
    deterministic: bool | str = False,
) -> bool:
    """Process-wide backend switches; returns whether the cuDNN autotuner is on."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if cudnn_benchmark and deterministic_on(deterministic):
        log.info("deterministic: cudnn_benchmark=true is off (the autotuner's pick varies)")
        cudnn_benchmark = False
    # Lets cuDNN time its algorithms for each new input shape and keep the fastest.
    torch.backends.cudnn.benchmark = cudnn_benchmark
    # "high" allows TF32 (CUDA) or bf16-based (CPU) matmul kernels for float32 inputs.
    torch.set_float32_matmul_precision(matmul_precision)
    return cudnn_benchmark
