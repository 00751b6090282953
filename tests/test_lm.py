"""task=lm on the synthetic token source: the loss covers every position, skips the
ignore index, and a model that can learn the source's Markov chain gets near its entropy."""

from __future__ import annotations

import math

import torch
from helpers import make_cfg, task_of
from omegaconf import OmegaConf

from gearshift.data.tokens import entropy_rate, markov_chain, synthetic_tokens
from gearshift.tasks import LanguageModel
from gearshift.trainer import fit

CPU = torch.device("cpu")
VOCAB = 32


def bigram_cfg(*overrides: str):
    """task=lm with the smallest model that can learn a first-order chain: a lookup table of
    next-token logits (torch.nn.Embedding(vocab, vocab))."""
    cfg = make_cfg(
        "logger=none",
        "progress_bar=false",
        "batch_size=16",
        "task=lm",
        "data=synthetic_tokens",
        f"data.vocab_size={VOCAB}",
        "data.block_size=16",
        "data.num_samples=512",
        "data.num_val_samples=64",
        *overrides,
        tiny=False,
    )
    model = {"_target_": "torch.nn.Embedding", "num_embeddings": VOCAB, "embedding_dim": VOCAB}
    cfg.model = OmegaConf.create(model)
    return cfg


def test_the_synthetic_windows_are_shifted_by_one_and_follow_the_chain():
    train, val = synthetic_tokens(64, 8, block_size=16, vocab_size=VOCAB, seed=3)
    assert train.inputs.shape == train.targets.shape == (64, 16) and len(val) == 8
    assert torch.equal(train.inputs[:, 1:], train.targets[:, :-1])
    matrix = markov_chain(VOCAB, 4, seed=3)
    assert (matrix[train.inputs, train.targets] > 0).all()  # every step is one the chain allows
    assert not torch.equal(train.inputs[:8], val.inputs)


def test_the_loss_is_over_every_position_except_the_ignore_index():
    task = LanguageModel(vocab_size=5, block_size=3, ignore_index=-100)
    logits = torch.randn(2, 3, 5)
    targets = torch.tensor([[1, 2, -100], [0, -100, 4]])
    kept = targets != -100
    expected = torch.nn.functional.cross_entropy(logits[kept], targets[kept])
    assert torch.allclose(task.loss(lambda _: logits, None, targets), expected)
    sums = task.eval_sums(lambda _: logits, None, targets)
    assert sums["tokens"].item() == 4
    metrics = task.eval_metrics({k: v.item() for k, v in sums.items()}, count=2)
    assert math.isclose(metrics["val_loss"], expected.item(), rel_tol=1e-5)
    assert math.isclose(metrics["val_perplexity"], math.exp(expected.item()), rel_tol=1e-5)


def test_a_bigram_model_learns_the_chain_down_to_near_its_entropy(tmp_path):
    cfg = bigram_cfg("max_steps=80", "optimizer=adamw", "optimizer.lr=0.1")
    assert isinstance(task_of(cfg), LanguageModel)
    best = entropy_rate(markov_chain(VOCAB, 4, seed=cfg.seed))  # ~1.35 nats; uniform: 3.47
    summary = fit(cfg, tmp_path).summary
    # a lookup table is exactly the chain's model class, so it gets close to the entropy
    # (measured 1.49 vs 1.35); chance would be log V = 3.47
    assert summary["val_loss"] < best + 0.3, (summary["val_loss"], best)
    assert math.isclose(summary["val_perplexity"], math.exp(summary["val_loss"]), rel_tol=1e-6)
