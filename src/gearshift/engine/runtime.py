"""Process-wide set-up: the device, seeds, backend switches (docs/gears.md: tip 15, TF32)."""

from __future__ import annotations

import logging
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


def configure_backends(device: torch.device, cudnn_benchmark: bool, matmul_precision: str) -> None:
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # Lets cuDNN time its algorithms for each new input shape and keep the fastest.
    torch.backends.cudnn.benchmark = cudnn_benchmark
    # "high" allows TF32 (CUDA) or bf16-based (CPU) matmul kernels for float32 inputs.
    torch.set_float32_matmul_precision(matmul_precision)
