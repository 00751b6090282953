"""What the advisor's rules share (observe/findings.py): what they read (`Subject`, the
config's `Nodes`) and what they return (`Finding`). The rules of a group that only applies
to some runs (cuda_findings.py, attention_probe.py) import from here, not from findings.py,
which imports them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from gearshift.config.schema import CompileConfig, DataLoaderConfig, MemoryFormatConfig

CONV = nn.modules.conv._ConvNd
_SHOWN = 4  # layers named in a message before "and N more"


@dataclass(frozen=True)
class Finding:
    id: str  # stable: tests, dashboards and people refer to it
    message: str  # what is wrong, in this run's terms
    fix: str  # what to change

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Nodes:
    """The config the rules read: its nodes and values, as config_advice.py `advise_config` picks them."""

    batch_size: int | str
    cudnn_benchmark: bool
    data: DictConfig
    dataloader: DataLoaderConfig
    memory_format: MemoryFormatConfig
    compile: CompileConfig
    strategy: str | None  # distributed.strategy
    task: DictConfig | None  # None: a config without a task node


@dataclass
class Subject:
    """What the rules look at."""

    nodes: Nodes
    model: nn.Module
    device: torch.device
    amp_dtype: torch.dtype | None

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def batch_size(self) -> int | None:
        batch_size = self.nodes.batch_size
        return batch_size if isinstance(batch_size, int) else None

    @property
    def host_data(self) -> bool:
        return not OmegaConf.select(self.nodes.data, "on_device", default=False)

    def short_last_batch(self) -> int:
        """Samples in the training epoch's short last batch (0: every batch is full)."""
        num_samples = OmegaConf.select(self.nodes.data, "num_samples")
        if self.nodes.dataloader.drop_last or not self.batch_size or not num_samples:
            return 0
        return num_samples % self.batch_size


def named(pairs: list[str]) -> str:
    more = f" and {len(pairs) - _SHOWN} more" if len(pairs) > _SHOWN else ""
    return ", ".join(pairs[:_SHOWN]) + more


def unwrapped(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.DataParallel) else model
