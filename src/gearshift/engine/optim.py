"""The optimizer (with the foreach/fused gear), gradient clipping and the learning-rate schedule."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from gearshift.config import ConfigError
from gearshift.config.schema import OptimizerConfig


def build_optimizer(model: nn.Module, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    # fused: one kernel for the whole update; foreach: one kernel per op across all tensors.
    if cfg.name == "muon":
        return build_muon(model, cfg)
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


class MuonWithAdamW(torch.optim.Optimizer):
    """optimizer=muon: torch's Muon on the hidden 2-D weights, AdamW on the rest, stepped
    together as one optimizer (the schedule, the GradScaler, zero_grad and checkpoints see
    one object; `param_groups` is both optimizers' groups, the same dicts).

    Under FSDP the matrices are DTensors sharded by rows; torch's Muon takes them as they
    are: its Newton-Schulz iteration runs on DTensors, whose matmuls and norm gather what
    they need, so every rank applies the update of the whole matrix to its shard."""

    def __init__(self, muon: torch.optim.Muon, adamw: torch.optim.AdamW) -> None:
        self.muon, self.adamw = muon, adamw
        self.parts = (muon, adamw)  # what FSDP's optimizer state dicts take (state/checkpointer.py)
        # the base class's bookkeeping (hooks, defaults) without re-adding the groups
        super().__init__([{"params": [torch.zeros(1)]}], {})
        self.param_groups = [*muon.param_groups, *adamw.param_groups]

    @property
    def state(self):  # type: ignore[override]
        return {**self.muon.state, **self.adamw.state}

    @state.setter
    def state(self, value) -> None:  # the base class's __init__ assigns an empty one
        pass

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        self.muon.step()
        self.adamw.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none)
        self.adamw.zero_grad(set_to_none)

    def state_dict(self) -> dict:  # type: ignore[override]
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: dict) -> None:  # type: ignore[override]
        self.muon.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])


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


def build_muon(model: nn.Module, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    """Muon (lr: optimizer.muon_lr) on the hidden matrices, AdamW (optimizer.lr) on the rest."""

    hidden, rest = muon_split(model)
    if not hidden:
        raise ConfigError(
            f"optimizer.name='muon' is not allowed; {type(model).__name__} has no 2-D hidden "
            "weights (Muon orthogonalises matrices; embeddings, heads, convolutions and 1-D "
            "parameters take AdamW): use optimizer=adamw"
        )
    muon = torch.optim.Muon(
        hidden, lr=cfg.muon_lr, weight_decay=cfg.weight_decay, momentum=cfg.muon_momentum
    )
    groups = [{"params": rest}] if cfg.weight_decay_1d else [
        {"params": [p for p in rest if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0},
    ]  # fmt: skip
    groups = [g for g in groups if g["params"]]
    adamw = torch.optim.AdamW(
        groups, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay,
        foreach=cfg.foreach, fused=cfg.fused or None,
    )  # fmt: skip
    return MuonWithAdamW(muon, adamw)
