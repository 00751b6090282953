"""models/blocks.py: the units FSDP shards one by one and checkpointing recomputes."""

from __future__ import annotations

import torch
import torchvision
from helpers import make_cfg
from torch import nn

from gearshift.models import GPT, MLP, SimpleCNN
from gearshift.models.blocks import model_blocks
from gearshift.models.build import build_model


def test_the_blocks_are_the_gpts_blocks_and_resnets_residual_blocks():
    gpt = GPT(vocab_size=32, block_size=8, n_layer=3, n_head=2, n_embd=16)
    assert model_blocks(gpt) == list(gpt.blocks)
    resnet = torchvision.models.resnet18(num_classes=10)
    blocks = model_blocks(resnet)
    assert len(blocks) == 8 and all(type(b).__name__ == "BasicBlock" for b in blocks)
    assert blocks == [*resnet.layer1, *resnet.layer2, *resnet.layer3, *resnet.layer4]
    # flat models have none: FSDP shards them as one unit, the root
    assert model_blocks(MLP([3, 8, 8], 10, hidden=16)) == []
    assert model_blocks(SimpleCNN(3, 10, width=8)) == []


def test_checkpointed_blocks_are_still_the_blocks():
    cfg = make_cfg("logger=none", "task=lm", "data=synthetic_tokens", "model=gpt", tiny=False)
    cfg.model.update(n_layer=2, n_embd=16, n_head=2, checkpointing=True)
    model = build_model(cfg.model, torch.device("cpu"), torch.contiguous_format)
    blocks = model_blocks(model)
    assert type(model.blocks).__name__ == "CheckpointedSequential"
    assert blocks == list(model.blocks) and len(blocks) == 2
    assert all(not isinstance(b, nn.Sequential) for b in blocks)  # the Blocks, not segments
