"""Activation checkpointing (`model.checkpointing=true`): memory bought with compute.

Each block runs under `torch.utils.checkpoint` (non-reentrant): the backward pass keeps
only the block's input and recomputes its inner activations when it needs them, so
activation memory drops to about one block's worth at a time for roughly one extra
forward pass. The blocks are the children of the model's nn.Sequential containers that
hold composite modules (blocks.py: ResNet's layerN blocks, the GPT's blocks); a model made of
flat nn.Sequentials only (conv, BN, ReLU, ...) is cut into segments that each start at a
weighted layer. Containers are swapped for a Sequential subclass with the same children,
so parameter names and state-dict keys do not change.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from gearshift.models.blocks import holds_blocks, recomputing

log = logging.getLogger(__name__)


@contextmanager
def _batchnorm_stats_kept(modules: list[nn.Module]) -> Iterator[None]:
    """The recomputation runs BatchNorm in training mode again: undo its second stats update."""
    norms = [
        m
        for module in modules
        for m in module.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    ]
    saved = [{n: b.clone() for n, b in m.named_buffers(recurse=False)} for m in norms]
    try:
        yield
    finally:
        with torch.no_grad():
            for m, buffers in zip(norms, saved, strict=True):
                for name, value in buffers.items():
                    getattr(m, name).copy_(value)


class CheckpointedSequential(nn.Sequential):
    """An nn.Sequential whose segments recompute their activations in the backward pass."""

    def __init__(self, sequential: nn.Sequential, segments: list[tuple[int, int]]) -> None:
        super().__init__(OrderedDict(sequential.named_children()))
        self.segments = segments  # [start, end) index ranges over the children
        self.train(sequential.training)

    def _run(self, start: int, end: int, x):
        for module in list(self._modules.values())[start:end]:
            x = module(x)
        return x

    def forward(self, x):
        active = recomputing() and torch.is_grad_enabled()
        for start, end in self.segments:
            if not active:
                x = self._run(start, end, x)
                continue
            if torch.compiler.is_compiling():  # compiled recomputation leaves buffers alone
                x = checkpoint(self._run, start, end, x, use_reentrant=False)
                continue
            modules = list(self._modules.values())[start:end]
            x = checkpoint(
                self._run,
                start,
                end,
                x,
                use_reentrant=False,
                context_fn=lambda modules=modules: (nullcontext(), _batchnorm_stats_kept(modules)),
            )
        return x


def _is_weighted(module: nn.Module) -> bool:
    return isinstance(module, (nn.Linear, nn.modules.conv._ConvNd))


def _flat_segments(sequential: nn.Sequential) -> list[tuple[int, int]]:
    """Cut before each weighted layer (conv, linear) once the segment already holds one."""
    segments, start, weighted = [], 0, False
    for i, module in enumerate(sequential):
        if _is_weighted(module) and weighted:
            segments.append((start, i))
            start, weighted = i, False
        weighted = weighted or _is_weighted(module)
    segments.append((start, len(sequential)))
    return segments


def _convert(module: nn.Module, wanted, segments_of) -> tuple[nn.Module, int]:
    """Swap every outermost Sequential for which `wanted` holds; (new module, segments)."""
    if isinstance(module, nn.Sequential) and wanted(module):
        segments = segments_of(module)
        return CheckpointedSequential(module, segments), len(segments)
    count = 0
    for name, child in list(module.named_children()):
        new, n = _convert(child, wanted, segments_of)
        if new is not child:
            setattr(module, name, new)
        count += n
    return module, count


def apply_activation_checkpointing(model: nn.Module) -> nn.Module:
    """`model` with its blocks checkpointed (the root itself is replaced if it is the container)."""
    model, count = _convert(model, holds_blocks, lambda s: [(i, i + 1) for i in range(len(s))])
    if count == 0:  # no container of blocks: segment the flat Sequentials instead
        model, count = _convert(model, lambda s: len(s) > 1, _flat_segments)
    if count == 0:
        log.warning(
            "model.checkpointing=true: %s has no nn.Sequential to checkpoint; nothing recomputes",
            type(model).__name__,
        )
    else:
        log.info("activation checkpointing: %d segments recompute in the backward pass", count)
    return model
