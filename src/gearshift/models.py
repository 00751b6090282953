"""Models: any importable class through `model._target_`, plus two small ones of our own.

Where the model gears act: the memory format (tip 16), torch.compile (tip 8) and
activation checkpointing (`model.checkpointing`, see checkpointing.py).
"""

from __future__ import annotations

import math

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from gearshift.checkpointing import apply_checkpointing


class MLP(nn.Sequential):
    """Flatten -> Linear(C*H*W, hidden) -> ReLU -> Linear(hidden, hidden) -> ReLU -> Linear."""

    def __init__(self, in_shape: list[int], num_classes: int, hidden: int = 512) -> None:
        super().__init__(
            nn.Flatten(),
            nn.Linear(math.prod(in_shape), hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )


class SimpleCNN(nn.Sequential):
    """Three conv-BN-ReLU stages and a linear head.

    `conv_bias=False` is tip 17: BatchNorm subtracts the mean right after the conv, so a
    conv bias there is computed, stored and updated for nothing.
    """

    def __init__(
        self, in_channels: int, num_classes: int, width: int = 32, conv_bias: bool = False
    ) -> None:
        def stage(c_in: int, c_out: int, stride: int) -> list[nn.Module]:
            conv = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=conv_bias)
            return [conv, nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]

        super().__init__(
            *stage(in_channels, width, 1),
            *stage(width, 2 * width, 2),
            *stage(2 * width, 4 * width, 2),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(4 * width, num_classes),
        )


def build_model(
    cfg: DictConfig, device: torch.device, memory_format: torch.memory_format
) -> nn.Module:
    """Instantiate `cfg` (the model group) on `device`, weights in `memory_format`."""
    options = OmegaConf.to_container(cfg, resolve=True)
    checkpointing = options.pop("checkpointing", False)  # a gear, not a model argument
    model = hydra.utils.instantiate(options)
    if checkpointing:
        model = apply_checkpointing(model)
    return model.to(device=device, memory_format=memory_format)


def maybe_compile(model: nn.Module, cfg: DictConfig) -> nn.Module:
    """Tip 8: torch.compile fuses pointwise ops and cuts Python overhead; off returns `model`."""
    if not cfg.enabled:
        return model
    return torch.compile(model, mode=cfg.mode, fullgraph=cfg.fullgraph, dynamic=cfg.dynamic)
