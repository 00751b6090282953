"""Process-wide set-up: the device, seeds and the backend switches (tips 15 and TF32)."""

from __future__ import annotations

import logging
import os
import random

import numpy as np
import torch

log = logging.getLogger(__name__)


def rank() -> int:
    """This process's global rank (0 when not launched as one of several)."""
    return int(os.environ.get("RANK", "0"))


def is_rank_zero() -> bool:
    return rank() == 0


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
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
