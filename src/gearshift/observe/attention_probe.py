"""The advisor's attention probe (findings.py `attention_without_sdpa`): one forward pass
that counts fused attention and attention done by hand. Loaded only for a model with
embeddings or an attention module.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call
from torch.overrides import TorchFunctionMode

from gearshift.models.blocks import recompute_disabled
from gearshift.tasks import Task


class AttentionCalls(TorchFunctionMode):
    """Counts what a forward pass calls: fused attention, and attention done by hand (a
    softmax over square (..., T, T) scores; nn.MultiheadAttention asked for its weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.fused = self.by_hand = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "scaled_dot_product_attention":
            self.fused += 1
        elif name == "softmax" and _square_scores(args[0] if args else None):
            self.by_hand += 1
        elif name == "multi_head_attention_forward" and kwargs.get("need_weights", True):
            self.by_hand += 1  # need_weights=True: torch computes softmax(QK^T) itself
        return func(*args, **kwargs)


def _square_scores(x) -> bool:
    return isinstance(x, torch.Tensor) and x.dim() >= 3 and x.shape[-1] == x.shape[-2] > 1


def attention_calls(model: nn.Module, task: Task, device: torch.device) -> AttentionCalls:
    """One forward pass of the task's example batch without gradients (through the task's
    loss, which knows what the model takes), on copies of the buffers (BatchNorm statistics
    stay) and with the random streams left as they were; it runs on the meta device too."""
    state = dict(model.named_parameters()) | {n: b.clone() for n, b in model.named_buffers()}
    devices = [device] if device.type == "cuda" else []
    with torch.no_grad(), torch.random.fork_rng(devices=devices), recompute_disabled():
        batch = task.example_batch(2, device)

        def forward(*args, **kwargs):
            return functional_call(model, state, args, kwargs)

        with AttentionCalls() as calls:
            task.loss_terms(forward, batch)
    return calls
