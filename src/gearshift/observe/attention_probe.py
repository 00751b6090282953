"""The advisor's attention rule (`attention_without_sdpa`) and its probe: one forward pass
that counts fused attention and attention done by hand. Loaded only for a model with
embeddings or an attention module.
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.func import functional_call
from torch.overrides import TorchFunctionMode

from gearshift.models.blocks import recompute_disabled
from gearshift.observe.advisor_base import Finding, Subject, unwrapped
from gearshift.tasks import Task, build_task

log = logging.getLogger(__name__)


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


def attention_without_sdpa(s: Subject) -> Finding | None:
    """The rule itself; findings.py checked that the model has parameters and attention
    (or embeddings) and the config a task."""
    model = unwrapped(s.model)
    parameter = next(model.parameters())
    try:
        calls = attention_calls(model, build_task(s.nodes.task), parameter.device)
    except Exception as error:  # a model the example batch does not fit: no verdict
        log.debug("advisor: attention probe of %s failed (%s)", type(model).__name__, error)
        return None
    if not calls.by_hand:
        return None
    return Finding(
        "attention-without-sdpa",
        f"{type(model).__name__} computes attention by hand ({calls.by_hand} softmax over the "
        f"scores per forward pass; {calls.fused} through scaled_dot_product_attention): the "
        "(T, T) score matrix is written to memory and read back, where the fused kernels "
        "(flash, memory-efficient) never build it",
        "torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) (model=gpt "
        "does); nn.MultiheadAttention: need_weights=False",
    )
