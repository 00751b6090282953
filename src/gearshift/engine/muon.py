"""optimizer=muon: Muon on the model's hidden matrices and AdamW on the rest, as two
torch optimizers that engine/optim.py's `Optimizers` steps, schedules and saves as one.
Imported by build_optimizers only when the optimizer node is the muon preset.

Under FSDP the matrices are DTensors sharded by rows; torch's Muon takes them as they are:
its Newton-Schulz iteration runs on DTensors, whose matmuls and norm gather what they need,
so every rank applies the update of the whole matrix to its shard."""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from torch import nn

from gearshift.config import ConfigError
from gearshift.config.instantiate import build, plain
from gearshift.config.schema import PRESET_CLASSES, OptimizerConfig


def muon_split(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(hidden 2-D weights, the rest): embeddings, a head (a parameter named `*head*`, or
    tied to an embedding), convolutions and 1-D parameters go to AdamW."""
    embedded = {
        id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()
    }
    hidden, rest = [], []
    for name, p in model.named_parameters():
        is_hidden = p.dim() == 2 and id(p) not in embedded and "head" not in name
        (hidden if is_hidden else rest).append(p)
    return hidden, rest


def build_muon(model: nn.Module, optimizer_cfg: DictConfig) -> list[torch.optim.Optimizer]:
    """[Muon (lr: optimizer.muon_lr) on the hidden matrices, AdamW (optimizer.lr and the
    node's other keywords) on the rest]."""

    hidden, rest = muon_split(model)
    if not hidden:
        raise ConfigError(
            f"optimizer.name='muon' is not allowed; {type(model).__name__} has no 2-D hidden "
            "weights (Muon orthogonalises matrices; embeddings, heads, convolutions and 1-D "
            "parameters take AdamW): use optimizer=adamw"
        )
    keywords = plain(OptimizerConfig.keywords(optimizer_cfg))
    weight_decay = keywords.get("weight_decay")
    own = {"lr": keywords.pop("muon_lr", None), "weight_decay": weight_decay,
           "momentum": keywords.pop("muon_momentum", None)}  # fmt: skip
    muon = torch.optim.Muon(hidden, **{k: v for k, v in own.items() if v is not None})
    groups = [{"params": rest}]
    if not optimizer_cfg.weight_decay_1d:
        from gearshift.engine.decay_groups import decay_groups

        groups = decay_groups(rest, {"weight_decay": weight_decay or 0.0})
    return [muon, build("optimizer", PRESET_CLASSES["adamw"], groups, keywords)]
