"""The optimizer (with the foreach/fused gear), gradient clipping and the learning-rate schedule."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from gearshift.config.schema import OptimizerConfig


def build_optimizer(model: nn.Module, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    # fused: one kernel for the whole update; foreach: one kernel per op across all tensors.
    common = {
        "lr": cfg.lr,
        "weight_decay": cfg.weight_decay,
        "foreach": cfg.foreach,
        "fused": cfg.fused or None,
    }
    params = parameter_groups(model, cfg.weight_decay, cfg.weight_decay_1d)
    if cfg.name == "sgd":
        return torch.optim.SGD(params, momentum=cfg.momentum, nesterov=cfg.nesterov, **common)
    return torch.optim.AdamW(params, betas=tuple(cfg.betas), **common)


def parameter_groups(
    model: nn.Module, weight_decay: float, decay_1d: bool
) -> list[dict[str, object]]:
    """One group, or (decay_1d=false, as nanoGPT) the matrices (weights, embeddings: 2-D and
    up) decayed and the 1-D parameters (biases, norm gains) not: decay pulls a LayerNorm's
    gain towards 0, not towards its neutral 1."""
    params = list(model.parameters())
    if decay_1d:
        return [{"params": params}]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return [group for group in groups if group["params"]]


def clip_grad_norm(parameters: Iterable[nn.Parameter], max_norm: float | None) -> torch.Tensor:
    """The total L2 norm of the gradients of the whole model, a tensor left on the device
    (no host sync); with `max_norm`, gradients whose norm exceeds it are scaled down to it.

    Call it on true gradients: under fp16, after the GradScaler has unscaled them. Under DDP
    every rank holds the all-reduced gradients, so its norm is the global one already. Under
    FSDP each rank holds DTensor shards: torch (2.14) reduces the shards' partial norms
    across ranks inside get_total_norm and returns a replicated DTensor, which
    `full_tensor()` turns into a plain tensor (no further communication) for clipping and
    logging. So every rank clips with the norm over all shards, never its own shard's
    (tests/test_distributed.py checks both against one process).
    """
    parameters = [p for p in parameters if p.grad is not None]
    total = torch.nn.utils.get_total_norm([p.grad for p in parameters])
    if isinstance(total, DTensor):
        total = total.full_tensor()
    if max_norm is not None:
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total)
    return total


def build_schedule(
    optimizer: torch.optim.Optimizer, cfg: OptimizerConfig, total_steps: int
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """Linear warm-up, then cosine decay to zero at `total_steps`; None for a constant lr."""
    if cfg.schedule == "constant" and cfg.lr_warmup_steps == 0:
        return None
    warmup = cfg.lr_warmup_steps

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cfg.schedule == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
