"""models/blocks.py: the units FSDP shards one by one and checkpointing recomputes."""

from __future__ import annotations

import math
import socket

import pytest
import torch
import torchvision
from helpers import make_cfg, record_logs
from torch import nn
from torch.distributed.fsdp import FSDPModule

from gearshift.models import GPT, MLP, SimpleCNN
from gearshift.models.blocks import model_blocks
from gearshift.models.factory import build_model
from train import fit


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


@pytest.mark.gpu
def test_fsdp_per_block_compiled_and_checkpointed_trains_the_gpt_on_cuda(tmp_path, monkeypatch):
    # one rank over NCCL: the CUDA path of per-block fully_shard under torch.compile, with
    # checkpointed blocks, bf16 and clipping, against the same run without FSDP and compile
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gpt = (
        *("logger=none", "progress_bar=false", "device=cuda", "task=lm", "data=synthetic_tokens"),
        *("model=gpt", "model.n_layer=2", "model.checkpointing=true", "amp=bf16"),
        *("optimizer.clip_grad_norm=0.5", "max_steps=6", "log_every_n_steps=1"),
    )
    losses = {}
    for name, gears in {"plain": (), "fsdp": ("distributed=fsdp", "compile=on")}.items():
        logged = record_logs(monkeypatch)
        if name == "fsdp":
            env = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_PORT=str(port))
            for key, value in (env | {"MASTER_ADDR": "127.0.0.1"}).items():
                monkeypatch.setenv(key, value)
        result = fit(make_cfg(*gpt, *gears, tiny=False), tmp_path / name)
        losses[name] = [m["train/loss"] for m in logged if "train/loss" in m]
        norms = [m["train/grad_norm"] for m in logged if "train/grad_norm" in m]
        assert len(norms) == 6 and all(math.isfinite(n) and n > 0 for n in norms)
    units = [n for n, m in result.model.named_modules() if isinstance(m, FSDPModule)]
    assert units == ["", "blocks.0", "blocks.1"]
    assert losses["fsdp"] == pytest.approx(losses["plain"], rel=0.05)  # bf16, compiled kernels
