"""A transformer's own FLOPs count, which MFU is measured by where a model states one.

A model with a `flops_per_token(time)` method (models/gpt.py's GPT: 6 x parameters without
the position embeddings + attention's 12 x layers x heads x head_dim x time, nanoGPT's and
PaLM's formula) is measured by that count, the one papers report, and the counted figure
stands beside it in the summary (`flops_source` says which one MFU uses). Loaded for such a
model only (mfu.py `MFU.measure`).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from gearshift.tasks import Task

ANALYTIC = "analytic: the model's flops_per_token (6 x parameters + attention)"


def analytic_flops_per_sample(model: nn.Module, task: Task, device: torch.device) -> float:
    """The model's own count, per sample (a sequence of the task's length)."""
    tokens = task.tokens_per_sample
    if tokens is None:  # a task that does not say: the length of its example sequences
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            batch = task.example_batch(1, device)
            tokens = next(x for x in tree_leaves(batch) if isinstance(x, torch.Tensor)).shape[-1]
    return model.flops_per_token(tokens) * tokens
