"""task=lm on the synthetic token source: the loss covers every position, skips the
ignore index, and a model that can learn the source's Markov chain gets near its entropy."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import CONF, make_cfg, task_of, train_in_process
from omegaconf import OmegaConf
from test_checkpoint import SignalAtStep
from test_tokens import prepare_text

from gearshift.app import preflight
from gearshift.data.tokens import entropy_rate, markov_chain, synthetic_tokens
from gearshift.state.preemption import TrainingStopped
from gearshift.tasks import LanguageModel
from train import fit

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
    assert torch.allclose(task.loss(lambda _: logits, (None, targets)), expected)
    predictions, targets = task.eval_step(lambda _: logits, (None, targets))
    for metric in task.validation.values():
        metric.update(predictions, targets)
    assert task.validation["loss"].weight.item() == 4  # the tokens with a target
    metrics = {f"val_{name}": float(m.compute()) for name, m in task.validation.items()}
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


def test_max_tokens_becomes_steps_of_the_global_batch_and_wins_over_epochs(tmp_path):
    # one optimizer step: batch 16 x accum 2 x block 16 = 512 tokens; 1100 tokens -> 3 steps
    cfg = bigram_cfg("max_tokens=1100", "accum=2", "epochs=50", "optimizer=adamw")
    result = fit(cfg, tmp_path / "tokens")
    summary = result.summary
    assert summary["steps"] == 3 and summary["max_tokens"] == 1100
    assert summary["tokens"] == 3 * 512 == summary["samples"] * 16
    # 5e3 on the command line is a whole number: ceil(5000 / 256) = 20 steps without accum;
    # with max_steps too, the budget that ends first wins
    assert fit(bigram_cfg("max_tokens=5e3"), tmp_path / "float").summary["steps"] == 20
    both = fit(bigram_cfg("max_tokens=5e3", "max_steps=4"), tmp_path / "both").summary
    assert both["steps"] == 4 and both["max_tokens"] == 5000


def test_a_resume_at_another_batch_size_trains_the_token_budget_and_ends_the_schedule(tmp_path):
    # 4096 tokens at batch 16 x block 16 = 256 tokens a step: 16 steps. Stopped after step 6
    # (1536 tokens) and resumed at batch 32 (512 a step), the 2560 tokens left are 5 steps:
    # the run ends at step 11 with the budget trained, where the cosine schedule reaches zero.
    # (Converting the budget again from the start would end at step 8, 1536 tokens short.)
    gears = ("max_tokens=4096", "optimizer=adamw", "optimizer.lr_warmup_steps=2")
    run_dir = tmp_path / "run"
    with SignalAtStep(6), pytest.raises(TrainingStopped):
        fit(bigram_cfg(*gears), run_dir)
    resumed = fit(bigram_cfg(*gears, "batch_size=32", "resume=auto"), run_dir)
    assert resumed.summary["steps"] == 11 and resumed.summary["tokens"] == 4096
    assert resumed.optimizers.param_groups[0]["lr"] == 0.0


@pytest.mark.parametrize("value", ["0", "1.5", "abc"])
def test_a_max_tokens_that_is_not_a_positive_integer_is_one_line_exit_2(
    tmp_path, monkeypatch, capsys, value
):
    monkeypatch.chdir(tmp_path)  # what train.py runs first, in this process
    with pytest.raises(SystemExit) as exit:
        preflight(CONF, argv=["experiment=lm", f"max_tokens={value}"])
    assert exit.value.code == 2
    shown = repr(float(value)) if value == "1.5" else repr(int(value) if value.isdigit() else value)
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: max_tokens={shown} is not allowed; expected an integer >= 1, e.g. 5000000 or "
        "5e6 (or null)"
    ]
    assert list(tmp_path.iterdir()) == []


def test_max_tokens_on_a_task_without_tokens_is_one_line_exit_2_and_no_run_folder(tmp_path):
    # an image task: its samples are not tokens (found as the run is built)
    result = train_in_process("model=mlp", "max_tokens=1000", "logger=none", "progress_bar=false",
                       "data.num_samples=64", "data.image_size=8", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: max_tokens=1000 is not allowed; Classification's samples are not tokens "
        "(task=lm's are): use max_steps or epochs"
    ], result.stderr
    assert list(tmp_path.iterdir()) == []


def token_run_cfg(folder, *overrides: str):
    """A lookup-table model (as bigram_cfg) on a token folder prepare_text.py wrote."""
    cfg = make_cfg("logger=none", "progress_bar=false", "batch_size=8", "task=lm", "data=tokens",
                   f"data.path={folder}", "data.block_size=16", "max_steps=4",
                   "optimizer=adamw", "optimizer.lr=0.05", *overrides, tiny=False)  # fmt: skip
    vocab = cfg.data.vocab_size
    cfg.model = OmegaConf.create(
        {"_target_": "torch.nn.Embedding", "num_embeddings": vocab, "embedding_dim": vocab}
    )
    return cfg


@pytest.mark.parametrize(
    ("text", "bytes_per_char"),
    [("the cat sees the dog.\n" * 60, 1.0), ("là où le chat dort, été.\n" * 60, 29 / 25)],
)
def test_val_bpb_is_the_loss_in_bits_over_the_bytes_a_token_stands_for(
    tmp_path, text, bytes_per_char
):
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    meta = prepare_text.prepare(tmp_path / "text.txt", tmp_path / "tokens")
    assert meta["bytes_per_token"] == pytest.approx(bytes_per_char, rel=1e-12)  # ASCII: 1 exactly
    summary = fit(token_run_cfg(tmp_path / "tokens"), tmp_path / "run").summary
    assert summary["val_bpb"] == pytest.approx(
        summary["val_loss"] / math.log(2) / bytes_per_char, rel=1e-9
    )


def test_no_val_bpb_without_a_byte_count(tmp_path):
    # synthetic tokens stand for no text; nanoGPT's folders (meta.pkl) record no byte count
    assert "val_bpb" not in fit(bigram_cfg("max_steps=1"), tmp_path).summary
