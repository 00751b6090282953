"""`optimizer.weight_decay_1d=false` (as nanoGPT): the matrices decayed, the 1-D parameters
not. Loaded only then, by engine/optim.py one_optimizer and engine/muon.py build_muon (for
AdamW's share)."""

from __future__ import annotations

from typing import Any

from torch import nn


def decay_groups(params: list[nn.Parameter], decayed: dict[str, Any]) -> list[dict[str, Any]]:
    """Two parameter groups: the matrices (weights, embeddings: 2-D and up) with `decayed`'s
    options, the 1-D parameters (biases, norm gains) with no weight decay: decay pulls a
    LayerNorm's gain towards 0, not towards its neutral 1. An empty group is left out."""
    groups = [
        {"params": [p for p in params if p.dim() >= 2], **decayed},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return [group for group in groups if group["params"]]
