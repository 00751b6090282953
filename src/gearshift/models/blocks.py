"""A model's blocks: the units activation checkpointing recomputes and FSDP shards one by one.

The convention: the blocks are the children of the model's outermost nn.Sequential
containers that hold composite modules. That covers the GPT's `blocks` (models/gpt.py),
ResNet's layerN BasicBlocks/Bottlenecks and torchvision ViT's encoder layers; a model of
your own opts in by keeping its repeated layers in an nn.Sequential. A model made of flat
Sequentials only (`mlp`, `simple_cnn`) has no blocks.
"""

from __future__ import annotations

from torch import nn


def holds_blocks(sequential: nn.Sequential) -> bool:
    """Whether some child of `sequential` is itself made of modules (a block, not a layer)."""
    return any(any(True for _ in child.children()) for child in sequential)


def model_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks of `model`, in the order they run; [] when it has none."""
    if isinstance(model, nn.Sequential) and holds_blocks(model):
        return list(model)
    return [block for child in model.children() for block in model_blocks(child)]
