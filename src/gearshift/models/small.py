"""Two small models of our own: an MLP and a CNN (docs/gears.md tip 17: no conv bias before BN)."""

from __future__ import annotations

import math

from torch import nn


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
