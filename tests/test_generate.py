"""python -m gearshift.generate and the GPT's KV cache: the cache changes no token, a char
model trained on a grammar writes its words, bad prompts are one line."""

from __future__ import annotations

import csv
import json
import re

import pytest
import torch
from distributed_workers import train_recorded
from helpers import make_cfg
from test_distributed import GPT_CLIPPED, two_ranks
from test_tokens import grammar_text, prepare_text

from gearshift import generate as generate_cli
from gearshift.data.text import codec_for
from gearshift.models.gpt import GPT, KVCache
from gearshift.models.sampling import generate
from gearshift.state.checkpoint_folders import latest_checkpoint
from train import fit

WORDS = set(["the", "cat", "a", "dog", "my", "old", "friend", "teacher", "every", "child", "our", "queen", "sees", "likes", "chases", "paints", "forgets", "carries", "moon", "red", "ball", "his", "garden", "river", "some", "bread", "letter", "today", "again"])  # fmt: skip


def tiny_gpt(block_size: int = 128) -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=50, block_size=block_size, n_layer=2, n_head=2, n_embd=32).eval()


@pytest.mark.parametrize("block_size", [128, 40])  # 40: the window slides past the context
def test_greedy_decoding_with_the_cache_equals_decoding_without_it(block_size):
    model = tiny_gpt(block_size)
    prompt = torch.randint(50, (3, 7), generator=torch.Generator().manual_seed(1))
    cached = generate(model, prompt, 64, temperature=0, use_cache=True)
    plain = generate(model, prompt, 64, temperature=0, use_cache=False)
    assert cached.shape == (3, 71)
    assert torch.equal(cached, plain)
    assert len(set(cached[0, 7:].tolist())) > 1  # not one token repeated: a real sequence


def test_the_cache_gives_the_logits_of_the_whole_window():
    model = tiny_gpt()
    idx = torch.randint(50, (2, 20))
    full = model(idx)
    cache = KVCache(model, 2, torch.device("cpu"))
    parts = [model(idx[:, :9], cache), model(idx[:, 9:10], cache), model(idx[:, 10:], cache)]
    assert cache.length == 20
    assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-5)


def test_sampling_is_seeded_and_top_k_1_is_greedy():
    model = tiny_gpt()
    prompt = torch.randint(50, (2, 4))
    draw = [generate(model, prompt, 20, 1.0, generator=torch.Generator().manual_seed(s)) for s in (3, 3, 4)]  # fmt: skip
    assert torch.equal(draw[0], draw[1]) and not torch.equal(draw[0], draw[2])
    top1 = generate(model, prompt, 20, 1.0, top_k=1, generator=torch.Generator().manual_seed(3))
    assert torch.equal(top1, generate(model, prompt, 20, temperature=0))


@pytest.fixture(scope="module")
def grammar_run(tmp_path_factory):
    """A char GPT trained experiment=lm-style on the grammar of test_tokens.py (~100 steps),
    and its checkpoint."""
    folder = tmp_path_factory.mktemp("grammar")
    (folder / "text.txt").write_text(grammar_text(1500))
    prepare_text.prepare(folder / "text.txt", folder / "tokens")

    def train(steps: int, name: str):
        cfg = make_cfg(
            "logger=none", "progress_bar=false", "task=lm", "data=tokens",
            f"data.path={folder / 'tokens'}", "data.block_size=32", "data.num_val_samples=64",
            "model=gpt", "model.n_layer=2", "model.n_embd=64", "batch_size=16",
            f"max_steps={steps}", "optimizer=adamw", "optimizer.lr=3e-3",
            "optimizer.weight_decay=0", "optimizer.schedule=constant", "ema.decay=0.9",
            tiny=False,
        )  # fmt: skip
        fit(cfg, folder / name)
        return latest_checkpoint(folder / name / "checkpoints")

    return train(120, "trained"), train(1, "untrained")


def word_share(text: str) -> float:
    """The share of the text's words that are words of the grammar."""
    words = re.findall(r"[a-z]+", text)
    return sum(word in WORDS for word in words) / max(len(words), 1)


def test_a_trained_char_model_writes_the_grammars_words(grammar_run, capsys):
    trained, untrained = grammar_run
    shares = {}
    for name, checkpoint in (("trained", trained), ("untrained", untrained)):
        code = generate_cli.main([f"resume={checkpoint}", "prompt=the cat ",
                                  "max_new_tokens=100", "num_samples=2", "temperature=0.5",
                                  "seed=0", "--raw"])  # fmt: skip
        out = capsys.readouterr().out
        assert code == 0 and out.count("--- sample") == 2
        samples = out.split("--- sample ")[1:]
        assert all(s.split("\n", 1)[1].startswith("the cat ") for s in samples)
        generated = "".join(s.split("\n", 1)[1][len("the cat ") :] for s in samples)
        shares[name] = word_share(generated)
    # an untrained model's letters rarely spell a word (measured 0.0)
    assert shares["trained"] > 0.6 > 0.3 > shares["untrained"], shares


def test_the_weight_average_is_sampled_unless_raw(grammar_run, capsys):
    trained, _ = grammar_run
    outs = []
    for raw in ([], ["--raw"]):
        assert generate_cli.main([f"resume={trained}", "prompt=a dog ", "temperature=0",
                                  "max_new_tokens=60", *raw]) == 0  # fmt: skip
        outs.append(capsys.readouterr().out)
    assert outs[0] != outs[1]  # ema.decay=0.9: the average differs from the last weights


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["prompt=the cat Ω"], "prompt='the cat Ω' is not allowed; the text holds characters"),
        (
            ["prompt=the", "max_new_tokens=0"],
            "max_new_tokens='0' is not allowed; expected an integer >= 1",
        ),
        (
            ["prompt=the", "temperature=-1"],
            "temperature='-1' is not allowed; expected a number >= 0",
        ),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(grammar_run, capsys, args, message):
    trained, _ = grammar_run
    assert generate_cli.main([f"resume={trained}", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), lines


def test_a_checkpoint_of_another_model_is_refused(tmp_path, capsys):
    cfg = make_cfg("logger=none", "progress_bar=false", "max_steps=1", "model=mlp")
    fit(cfg, tmp_path)
    checkpoint = latest_checkpoint(tmp_path / "checkpoints")
    assert generate_cli.main([f"resume={checkpoint}", "prompt=1 2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "generation needs model=gpt" in err, err


def test_samples_at_every_nth_validation_reach_csv_tensorboard_and_wandb(no_wandb_key, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (tmp_path / "text.txt").write_text(grammar_text(60))
    prepare_text.prepare(tmp_path / "text.txt", tmp_path / "tokens")
    cfg = make_cfg(
        "logger=[wandb,tensorboard,csv]", "progress_bar=false", "task=lm", "data=tokens",
        f"data.path={tmp_path / 'tokens'}", "data.block_size=16", "data.num_val_samples=4",
        "model=gpt", "model.n_layer=1", "model.n_embd=32", "model.n_head=2", "batch_size=4",
        "max_steps=5", "val_every_n_steps=1", "task.sample_every=2", "task.sample_prompt=the",
        "task.sample_tokens=12", "task.sample_count=2", "optimizer=adamw", tiny=False,
    )  # fmt: skip
    fit(cfg, tmp_path / "run")
    run = tmp_path / "run"
    with (run / "metrics.csv").open(newline="") as file:
        rows = [row for row in csv.reader(file) if row[1].startswith("samples/")]
    # validations at steps 1..5: every 2nd (steps 2, 4) and the last (5) draw samples
    assert sorted({(int(step), name) for step, name, _ in rows}) == [
        (s, f"samples/{i}") for s in (2, 4, 5) for i in (0, 1)
    ]
    texts = [text for _, _, text in rows]
    assert all(t.startswith("the") and len(t) == 3 + 12 for t in texts), texts
    assert len(set(texts)) > 1  # drawn, not one fixed string
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    logged = events.Tensors("samples/text_summary")
    assert [e.step for e in logged] == [2, 4, 5]
    board = logged[-1].tensor_proto.string_val[0].decode()
    assert all(t in board for step, _, t in rows if step == "5")
    [table] = run.glob("wandb/offline-run-*/files/media/table/samples_4_*.table.json")
    data = json.loads(table.read_text())
    assert data["columns"] == ["step", "index", "text"] and len(data["data"]) == 2
    assert [row[2] for row in data["data"]] == [t for s, _, t in rows if s == "4"]


def test_a_sample_prompt_outside_the_vocabulary_is_one_line_before_training(tmp_path):
    from gearshift.config import ConfigError

    (tmp_path / "text.txt").write_text(grammar_text(60))
    prepare_text.prepare(tmp_path / "text.txt", tmp_path / "tokens")
    cfg = make_cfg("logger=none", "progress_bar=false", "task=lm", "data=tokens",
                   f"data.path={tmp_path / 'tokens'}", "data.block_size=16", "model=gpt",
                   "model.n_layer=1", "model.n_embd=32", "max_steps=2", "task.sample_every=1",
                   "task.sample_prompt=Zebra", tiny=False)  # fmt: skip
    with pytest.raises(ConfigError) as error:
        fit(cfg, tmp_path / "run")
    assert str(error.value).startswith(
        "task.sample_prompt='Zebra' is not allowed; the text holds characters the table lacks"
    )
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_gpt2_byte_pairs_through_tiktoken_prepare_train_and_generate(tiny_gpt2, tmp_path, capsys):
    text = grammar_text(300)
    (tmp_path / "text.txt").write_text(text)
    meta = prepare_text.prepare(tmp_path / "text.txt", tmp_path / "tokens", tokenizer="gpt2")
    assert meta["tokenizer"] == "gpt2" and meta["vocab_size"] == tiny_gpt2.n_vocab == 267
    assert meta["bytes_per_token"] > 1.1  # the merges acted: fewer tokens than bytes (1.12)
    codec = codec_for({"path": str(tmp_path / "tokens"), "vocab_size": meta["vocab_size"]})
    ids = codec.encode("the cat sees a dog")
    assert [tiny_gpt2.decode([i]) for i in ids[:2]] == ["the", " cat"]
    assert codec.decode(ids) == "the cat sees a dog"
    cfg = make_cfg(
        "logger=none", "progress_bar=false", "task=lm", "data=tokens",
        f"data.path={tmp_path / 'tokens'}", "data.block_size=16", "data.num_val_samples=4",
        "model=gpt", "model.n_layer=1", "model.n_embd=32", "model.n_head=2", "batch_size=8",
        "max_steps=2", tiny=False,
    )  # fmt: skip
    fit(cfg, tmp_path / "run")
    checkpoint = latest_checkpoint(tmp_path / "run" / "checkpoints")
    assert generate_cli.main([f"resume={checkpoint}", "prompt=the cat", "max_new_tokens=6",
                              "temperature=0", "seed=0"]) == 0  # fmt: skip
    out = capsys.readouterr().out.rstrip("\n")
    assert out.startswith("the cat") and len(out) > len("the cat")


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_samples_under_2_ranks_are_logged_once_by_rank_0(tmp_path, strategy):
    # DDP: rank 0 samples alone; FSDP: every rank takes part in the forward passes (sharded
    # weights), so neither hangs, and rank 0's metrics.csv holds each sample once
    two_ranks(tmp_path, [*GPT_CLIPPED, f"distributed={strategy}", "batch_size=8",
                           "max_steps=2", "val_every_n_steps=1", "task.sample_every=1",
                           "task.sample_tokens=5", "logger=csv"], worker=train_recorded)  # fmt: skip
    with (tmp_path / "rank0" / "metrics.csv").open(newline="") as file:
        rows = [row for row in csv.reader(file) if row[1].startswith("samples/")]
    assert [(step, name) for step, name, _ in rows] == [
        (step, f"samples/{i}") for step in ("1", "2") for i in (0, 1)
    ]
    # synthetic tokens have no vocabulary: ids, the prompt (id 0) and 5 new ones
    assert all(len(text.split()) == 6 and text.split()[0] == "0" for _, _, text in rows)


def test_the_default_prompt_works_for_experiment_lm_and_a_text_without_newlines(tmp_path, capsys):
    # the commands: `train.py experiment=lm`, then generate without prompt= (once
    # "\n", which synthetic token ids and a table without newlines cannot encode)
    (tmp_path / "text.txt").write_text("the cat sees a dog " * 40)  # no newline anywhere
    prepare_text.prepare(tmp_path / "text.txt", tmp_path / "tokens")
    for name, data in (
        ("embedded", []),
        ("text", ["data=tokens", f"data.path={tmp_path / 'tokens'}", "data.block_size=16"]),
    ):
        cfg = make_cfg("experiment=lm", "logger=none", "progress_bar=false", "max_steps=1",
                       "model.n_layer=1", "model.n_embd=32", *data, tiny=False)  # fmt: skip
        fit(cfg, tmp_path / name)
        checkpoint = latest_checkpoint(tmp_path / name / "checkpoints")
        assert generate_cli.main([f"resume={checkpoint}", "max_new_tokens=8"]) == 0
        captured = capsys.readouterr()
        assert captured.err == "", captured.err
        first = " " if name == "text" else "0 "  # id 0: the table's first character, or "0"
        assert captured.out.startswith(first) and len(captured.out) > len(first) + 1
        assert generate_cli.main([f"resume={checkpoint}", "prompt=the zebra", "max_new_tokens=8"]) == 2  # fmt: skip
        lines = capsys.readouterr().err.strip().splitlines()
        if name == "text":  # the characters the table lacks, each once
            assert lines == [
                "error: prompt='the zebra' is not allowed; the text holds characters the table "
                "lacks: 'zbr' (its 10 characters: ' acdeghost')"
            ]
        else:
            assert len(lines) == 1 and "give token ids below 64" in lines[0], lines
