"""A config's data served as batches without a run: what the tests and scripts/bench.py,
scripts/bench_data.py read (a run builds its batches in build.py). No run loads it."""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig

from gearshift.data.loading import build_batches
from gearshift.data.sources import build_datasets
from gearshift.models.factory import memory_layout


def data_batches(
    cfg: DictConfig, device: torch.device, rank: int = 0, world_size: int = 1
) -> tuple[Any, Any | None]:
    """The source's datasets served as this rank's batches, for a fixed `cfg.batch_size`:
    the data of a run without the run (tests, scripts/bench.py)."""
    train_set, val_set = build_datasets(cfg.data, device)
    layout = memory_layout(cfg.memory_format.channels_last)
    return build_batches(
        cfg.data, cfg.dataloader, train_set, val_set, device, cfg.batch_size, cfg.seed,
        cfg.max_steps, layout, rank, world_size,
    )  # fmt: skip
