"""model=gpt: a nanoGPT-class decoder. Shapes, causality, the padded vocabulary, GPT-2's
initialisation, weight tying, activation checkpointing per block, and the presets."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import make_cfg
from torch import nn

from gearshift.models import GPT
from gearshift.models.factory import build_model

CPU = torch.device("cpu")


def small(**kwargs) -> GPT:
    torch.manual_seed(0)
    options = dict(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32) | kwargs
    return GPT(**options)


def test_token_ids_become_logits_over_the_real_vocabulary_only():
    model = small()
    assert model.padded_vocab_size == 64 and model.lm_head.out_features == 64
    idx = torch.randint(50, (3, 16))
    logits = model(idx)
    assert logits.shape == (3, 16, 50) and logits.dtype == torch.float32
    # the logits are the head's first 50 outputs: the 14 padded ids are cut, never scored
    hidden = model.ln_f(model.blocks(model.wte(idx) + model.wpe(torch.arange(16))))
    assert torch.allclose(logits, (hidden @ model.wte.weight.T)[..., :50], atol=1e-5)
    assert model(idx[:, :5]).shape == (3, 5, 50)  # shorter sequences too
    assert small(vocab_size=64).padded_vocab_size == 64
    assert small(vocab_size=65, pad_vocab_to=1).padded_vocab_size == 65


def test_the_gpt2_vocabulary_is_padded_to_50304():
    assert GPT(50257, 8, n_layer=1, n_head=1, n_embd=8).padded_vocab_size == 50304


def test_a_position_sees_only_the_positions_before_it():
    model = small().eval()
    idx = torch.randint(50, (2, 16))
    changed = idx.clone()
    changed[:, 10] = (idx[:, 10] + 1) % 50
    before, after = model(idx), model(changed)
    assert torch.allclose(before[:, :10], after[:, :10], atol=1e-6)
    assert not torch.allclose(before[:, 10:], after[:, 10:])


def test_gpt2_initialisation_and_weight_tying():
    model = small(n_layer=8, n_embd=256, n_head=4)
    assert model.lm_head.weight is model.wte.weight
    names = [name for name, _ in model.named_parameters()]
    assert "lm_head.weight" not in names  # one matrix, counted and optimised once
    for name, p in model.named_parameters():
        if name.endswith(("attn.proj.weight", "mlp.proj.weight")):
            assert math.isclose(p.std().item(), 0.02 / math.sqrt(16), rel_tol=0.1), name
        elif p.dim() == 2:
            assert math.isclose(p.std().item(), 0.02, rel_tol=0.1), name
    assert all(not isinstance(m, nn.Linear) or m.bias is None for m in model.modules())
    with_bias = small(bias=True)
    assert all(
        m.bias is not None and not m.bias.any()
        for m in with_bias.modules()
        if isinstance(m, nn.Linear) and m is not with_bias.lm_head
    )


def test_the_untrained_model_predicts_about_uniformly():
    model = small()
    idx, targets = torch.randint(50, (2, 4, 16))
    loss = nn.functional.cross_entropy(model(idx).flatten(0, 1), targets.flatten())
    assert abs(loss.item() - math.log(50)) < 0.1  # small initial weights: near-uniform logits


def test_dropout_acts_in_training_only():
    model = small(dropout=0.5)
    idx = torch.randint(50, (2, 16))
    assert not torch.equal(model(idx), model(idx))
    model.eval()
    assert torch.equal(model(idx), model(idx))


def test_checkpointing_wraps_each_block_and_changes_no_gradient():
    cfg = make_cfg("logger=none", "task=lm", "data=synthetic_tokens", "model=gpt", tiny=False)
    cfg.model.update(n_layer=2, n_embd=32, n_head=2, dropout=0.0)
    grads = []
    for checkpointing in (False, True):
        cfg.model.checkpointing = checkpointing
        torch.manual_seed(0)
        model = build_model(cfg.model, CPU, torch.contiguous_format)
        idx = torch.randint(cfg.data.vocab_size, (2, cfg.data.block_size))
        model(idx).logsumexp(-1).mean().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
        if checkpointing:
            assert type(model.blocks).__name__ == "CheckpointedSequential"
            assert model.blocks.segments == [(0, 1), (1, 2)]  # one segment per block
            assert isinstance(model.wte, nn.Embedding)  # the int input is not checkpointed
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-6), name


@pytest.mark.parametrize(
    ("preset", "expected"),
    [("gpt", (4, 4, 128, 64, 64)), ("gpt2", (12, 12, 768, 1024, 1024))],
)
def test_the_presets_compose_with_the_token_data(preset, expected):
    cfg = make_cfg("logger=none", "task=lm", "data=synthetic_tokens", f"model={preset}", tiny=False)
    m = cfg.model
    assert (m.n_layer, m.n_head, m.n_embd, m.block_size, cfg.data.block_size) == expected
    assert cfg.task.block_size == cfg.data.block_size and m.vocab_size == cfg.data.vocab_size
    shorter = make_cfg("logger=none", "task=lm", "data=synthetic_tokens", f"model={preset}",
                       "data.block_size=32", tiny=False)  # fmt: skip
    assert shorter.data.block_size == shorter.task.block_size == 32


def test_gpt2_has_gpt2s_124m_parameters():
    with torch.device("meta"):
        original = GPT(50257, 1024, n_layer=12, n_head=12, n_embd=768, bias=True, pad_vocab_to=1)
        preset = GPT(50257, 1024, n_layer=12, n_head=12, n_embd=768)  # no biases, 50304 rows
    assert original.num_params(position_embeddings=True) == 124_439_808  # GPT-2 small's count
    assert original.num_params() == 124_439_808 - 1024 * 768
    assert preset.num_params(position_embeddings=True) == 124_373_760
