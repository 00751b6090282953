"""The gear advisor asked about a composed config: `advise=true` (build.py) and
`python -m gearshift.advise`. Its rules (observe/findings.py) read the nodes picked here."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from gearshift.engine.precision import resolve_amp
from gearshift.observe.advisor_base import Nodes
from gearshift.observe.findings import advise

if TYPE_CHECKING:
    from gearshift.observe.findings import Finding


def advise_config(
    cfg: DictConfig, model: nn.Module, device: torch.device,
    amp_dtype: torch.dtype | str | None = "resolve", batch_size: int | str | None = None,
) -> list[Finding]:  # fmt: skip
    """The advisor's findings for `cfg`'s nodes, `model` and `device` (amp_dtype: autocast's,
    if known; "resolve": amp.dtype's on `device`; batch_size: the run's, if decided; None:
    the config's)."""
    nodes = Nodes(
        batch_size=cfg.batch_size if batch_size is None else batch_size,
        cudnn_benchmark=cfg.cudnn_benchmark,
        data=cfg.data,
        dataloader=cfg.dataloader,
        memory_format=cfg.memory_format,
        compile=cfg.compile,
        strategy=OmegaConf.select(cfg, "distributed.strategy"),
        task=cfg.task if "task" in cfg else None,
    )
    if amp_dtype == "resolve":
        amp_dtype = resolve_amp(cfg.amp.dtype, device).dtype
    return advise(nodes, model, device, amp_dtype)
