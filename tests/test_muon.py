"""optimizer=muon: torch's Muon on the hidden matrices, AdamW on the rest, each with its own
lr; its state saves and resumes exactly; a model without hidden matrices is one line."""

from __future__ import annotations

import pytest
import torch
from helpers import make_cfg
from omegaconf import OmegaConf
from test_checkpoint import assert_same_parameters

from gearshift.config import ConfigError
from gearshift.engine.optim import MuonWithAdamW, build_optimizer
from gearshift.models import GPT
from gearshift.parallel.distributed import Ranks
from gearshift.state.checkpoint import latest_checkpoint, load_checkpoint
from gearshift.trainer import Trainer, fit

CPU = torch.device("cpu")


def lm_cfg(*overrides: str):
    return make_cfg("logger=none", "progress_bar=false", "experiment=lm", "optimizer=muon",
                    "data.num_samples=128", "data.num_val_samples=16", "model.n_layer=2",
                    "model.n_embd=32", "model.n_head=2", *overrides, tiny=False)  # fmt: skip


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest_each_at_its_lr():
    cfg = lm_cfg("optimizer.muon_lr=0.05", "optimizer.lr=0.001")
    model = GPT(64, 16, n_layer=2, n_head=2, n_embd=32)
    optimizer = build_optimizer(model, cfg.optimizer)
    assert isinstance(optimizer, MuonWithAdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    on_muon = {names[id(p)] for g in optimizer.muon.param_groups for p in g["params"]}
    on_adamw = {names[id(p)] for g in optimizer.adamw.param_groups for p in g["params"]}
    assert on_muon == {f"blocks.{i}.{m}.weight" for i in range(2)
                       for m in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")}  # fmt: skip
    assert on_adamw == set(names.values()) - on_muon  # wte (the tied head), wpe, LayerNorms
    assert {g["lr"] for g in optimizer.muon.param_groups} == {0.05}
    assert {g["lr"] for g in optimizer.adamw.param_groups} == {0.001}
    assert len(optimizer.param_groups) == 3  # what the schedule scales: both optimizers' groups


def test_muon_state_saves_and_resumes_exactly(tmp_path):
    steady = ("optimizer.schedule=constant", "optimizer.lr_warmup_steps=0")
    whole = fit(lm_cfg(*steady, "max_steps=6"), tmp_path / "whole")
    fit(lm_cfg(*steady, "max_steps=3"), tmp_path / "split")
    saved = load_checkpoint(latest_checkpoint(tmp_path / "split/checkpoints"))["optimizer"]
    buffers = [s["momentum_buffer"] for s in saved["muon"]["state"].values()]
    assert len(buffers) == 8 and all(b.abs().sum() > 0 for b in buffers)  # Muon's own state
    resumed = fit(lm_cfg(*steady, "max_steps=6"), tmp_path / "split")
    assert resumed.summary["steps"] == 6
    assert_same_parameters(whole.model, resumed.model)


def test_a_model_without_hidden_matrices_is_one_line(tmp_path):
    cfg = lm_cfg()
    cfg.model = OmegaConf.create({"_target_": "torch.nn.Embedding", "num_embeddings": 64,
                                  "embedding_dim": 64})  # fmt: skip
    with pytest.raises(ConfigError) as error:
        Trainer(cfg, tmp_path, None, Ranks(), "none", CPU)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("optimizer.name='muon' is not allowed; Embedding has no 2-D hidden weights")  # fmt: skip
