"""data=tokens and scripts/prepare_text.py: token files in nanoGPT's layout, written from text,
read back exactly, checked before any run folder exists, resumed and sharded like any source."""

from __future__ import annotations

import json
import pickle
import re
from collections import Counter
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import load_script, make_cfg, record_logs, seconds, train_in_process
from omegaconf import OmegaConf
from rich.console import Console
from test_checkpoint import assert_same_parameters, stop_and_resume

from gearshift.config import ConfigError, check_config
from gearshift.config import token_files as token_files_module
from gearshift.config.token_files import check_token_folder
from gearshift.data.text import tokenizer_from_meta
from gearshift.data.tokens import token_files
from gearshift.data_batches import data_batches
from gearshift.observe.console import print_summary
from train import fit

CPU = torch.device("cpu")
prepare_text = load_script("prepare_text")
grammar = load_script("grammar")
grammar_text, unigram_entropy, bigram_entropy = (
    grammar.grammar_text, grammar.unigram_entropy, grammar.bigram_entropy
)  # fmt: skip


def token_folder(path: Path, ids: np.ndarray, vocab_size: int, **meta) -> Path:
    """A folder as prepare_text.py writes it, from ids (train: all but the last 64, val: those)."""
    path.mkdir(parents=True, exist_ok=True)
    ids = np.asarray(ids)
    splits = {"train": ids[:-64], "val": ids[-64:]}
    for name, part in splits.items():
        part.astype(meta.get("dtype", "uint16")).tofile(path / f"{name}.bin")
    info = {
        "vocab_size": vocab_size,
        "dtype": "uint16",
        "tokenizer": "none",
        "max_token_id": int(ids.max()),
        "train_tokens": len(splits["train"]),
        "val_tokens": 64,
        **meta,
    }
    (path / "meta.json").write_text(json.dumps(info))
    return path


def tokens_cfg(path: Path, *overrides: str):
    """task=lm on data=tokens with a bigram table (torch.nn.Embedding(vocab, vocab)) as the
    model: the smallest that learns, and enough to test the data."""
    cfg = make_cfg(
        "logger=none",
        "progress_bar=false",
        "batch_size=16",
        "task=lm",
        "data=tokens",
        f"data.path={path}",
        "data.block_size=16",
        *overrides,
        tiny=False,
    )
    vocab = cfg.data.vocab_size
    model = {"_target_": "torch.nn.Embedding", "num_embeddings": vocab, "embedding_dim": vocab}
    cfg.model = OmegaConf.create(model)
    return cfg


# ------------------------------------------------------------------ prepare_text.py


def test_prepare_text_round_trips_characters(tmp_path):
    text = "Ünïcode 😀 and\r\nWindows lines\n" + grammar_text(200)
    (tmp_path / "in.txt").write_bytes(text.encode("utf-8"))
    assert prepare_text.main([str(tmp_path / "in.txt"), str(tmp_path / "out")]) == 0
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["tokenizer"] == "char" and meta["dtype"] == "uint16"
    assert meta["vocab_size"] == len(set(text)) and meta["max_token_id"] == len(set(text)) - 1
    train, val = (np.fromfile(tmp_path / "out" / f"{s}.bin", dtype=np.uint16) for s in SPLITS)
    assert len(val) == round(0.1 * len(text)) and len(train) + len(val) == len(text)
    assert [meta["train_tokens"], meta["val_tokens"]] == [len(train), len(val)]
    decode = tokenizer_from_meta(meta).decode
    assert decode(train) + decode(val) == text  # \r\n, accents and emoji as they were
    assert decode(val) == text[-len(val) :]  # the validation split is the end of the text


SPLITS = ("train", "val")


def test_prepare_text_writes_uint32_when_the_vocabulary_needs_it(tmp_path):
    text = "".join(chr(0x10000 + i) for i in range(70_000)) * 2  # 70000 distinct characters
    (tmp_path / "in.txt").write_text(text, encoding="utf-8")
    meta = prepare_text.prepare(tmp_path / "in.txt", tmp_path / "out")
    assert meta["dtype"] == "uint32" and meta["vocab_size"] == 70_000
    train, _ = token_files(str(tmp_path / "out"), block_size=8, vocab_size=70_000)
    inputs, targets = train[1]
    assert inputs.dtype == torch.int64 and inputs.tolist() == list(range(8, 16))
    assert targets.tolist() == list(range(9, 17))  # ids above 65535 read back whole
    ids = np.fromfile(tmp_path / "out" / "val.bin", dtype=np.uint32)
    assert tokenizer_from_meta(meta).decode(ids) == text[-len(ids) :]


def test_prepare_text_bad_input_is_one_error_line(tmp_path, capsys, monkeypatch):
    assert prepare_text.main([str(tmp_path / "missing.txt"), str(tmp_path / "out")]) == 2
    assert re.fullmatch(
        r"error: FILE=.*missing\.txt' cannot be read as utf-8: .*\n", capsys.readouterr().err
    )
    (tmp_path / "tiny.txt").write_text("abc")
    assert prepare_text.main([str(tmp_path / "tiny.txt"), str(tmp_path / "out")]) == 2
    assert "too few for a training and a validation split" in capsys.readouterr().err
    monkeypatch.setitem(__import__("sys").modules, "tiktoken", None)  # not installed
    (tmp_path / "in.txt").write_text(grammar_text(50))
    assert (
        prepare_text.main([str(tmp_path / "in.txt"), str(tmp_path / "out"), "--tokenizer", "gpt2"])
        == 2
    )
    err = capsys.readouterr().err
    assert (
        err
        == "error: --tokenizer gpt2 needs tiktoken, an optional extra: pip install 'gearshift[lm]' (or pip install tiktoken)\n"
    )
    assert not (tmp_path / "out").exists()  # nothing written


def test_prepare_text_gpt2_round_trips(tiny_gpt2, tmp_path):
    text = grammar_text(100)
    (tmp_path / "in.txt").write_text(text)
    meta = prepare_text.prepare(tmp_path / "in.txt", tmp_path / "out", tokenizer="gpt2")
    assert meta["vocab_size"] == tiny_gpt2.n_vocab and meta["dtype"] == "uint16"
    decode = tokenizer_from_meta(meta).decode
    train, val = (np.fromfile(tmp_path / "out" / f"{s}.bin", dtype=np.uint16) for s in SPLITS)
    assert decode(train) + decode(val) == text


# ------------------------------------------------------------------ data=tokens


def test_windows_are_the_files_tokens_shifted_by_one(tmp_path):
    ids = np.arange(1000)
    folder = token_folder(tmp_path / "d", ids, vocab_size=1000)
    cfg = tokens_cfg(folder)
    assert cfg.data.vocab_size == cfg.task.vocab_size == 1000  # from meta.json
    train, val = token_files(str(folder), block_size=16, vocab_size=1000)
    assert len(train) == (936 - 1) // 16 and len(val) == (64 - 1) // 16
    inputs, targets = train[3]
    assert inputs.dtype == targets.dtype == torch.int64
    assert inputs.tolist() == ids[48:64].tolist() and targets.tolist() == ids[49:65].tolist()
    assert val[0][0].tolist() == ids[936:952].tolist()
    few, _ = token_files(str(folder), block_size=16, vocab_size=1000, num_samples=3)
    assert [few[i][0][0].item() for i in range(3)] == [0, 28 * 16, 57 * 16]  # spread evenly
    _, none = token_files(str(folder), 16, 1000, num_val_samples=0)
    assert none is None
    (folder / "val.bin").unlink()  # not needed then
    assert len(token_files(str(folder), 16, 1000, num_val_samples=0)[0]) == len(train)
    # a spawned worker gets the dataset pickled: without the parent's mapping, it maps its own
    copy = pickle.loads(pickle.dumps(train))
    assert train._tokens is not None and copy._tokens is None
    assert torch.equal(copy[3][0], inputs)


def test_nanogpt_meta_pkl_is_read_as_plain_values_only(tmp_path):
    folder = tmp_path / "shakespeare_char"
    folder.mkdir()
    chars = "\n !abc"
    meta = {
        "vocab_size": 6,
        "itos": dict(enumerate(chars)),
        "stoi": {c: i for i, c in enumerate(chars)},
    }
    (folder / "meta.pkl").write_bytes(pickle.dumps(meta))
    ids = np.array([3, 4, 5, 1, 2, 0] * 40, dtype=np.uint16)
    ids[:200].tofile(folder / "train.bin")
    ids[200:].tofile(folder / "val.bin")
    cfg = tokens_cfg(folder)
    assert cfg.data.vocab_size == 6
    check_config(cfg)  # no max_token_id recorded: every id is scanned
    assert tokenizer_from_meta(meta).decode(ids[:6]) == "abc !\n"
    (folder / "meta.pkl").write_bytes(pickle.dumps(Counter(meta)))  # a class: refused unread
    with pytest.raises(
        ConfigError, match=r"meta\.pkl cannot be read: it names collections\.Counter"
    ):
        token_files(str(folder), 16, 6)


def _bad_folder(kind: str, root: Path) -> tuple[list[str], str]:
    """A token folder with one problem: (overrides, the expected error without `error: `)."""
    folder = token_folder(root / "d", np.arange(200) % 50, vocab_size=50)
    path = f"data.path='{folder}' is not allowed; "
    train, val = folder / "train.bin", folder / "val.bin"
    if kind == "odd-bytes":  # cut short by a byte
        train.write_bytes(train.read_bytes()[:-1])
        return (
            [],
            f"{path}{train} has 271 bytes, not a whole number of uint16 tokens (2 bytes each): it is damaged, or written in another dtype",
        )
    if kind == "wrong-dtype":  # written as uint32, read as meta.json's uint16
        (np.arange(136) % 50).astype(np.uint32).tofile(train)
        return (
            [],
            f"{path}{train} holds 272 uint16 tokens, meta.json says 136: it is damaged, or written in another dtype",
        )
    if kind == "id-above-record":
        np.full(136, 60, dtype=np.uint16).tofile(train)
        return (
            [],
            f"{path}{train} holds token id 60, above meta.json's max_token_id 49: it is damaged, or written in another dtype than uint16",
        )
    if kind == "id-beyond-vocab":  # a meta file without the record: the scan finds it
        meta = json.loads((folder / "meta.json").read_text())
        del meta["max_token_id"]
        (folder / "meta.json").write_text(json.dumps(meta))
        np.full(64, 50, dtype=np.uint16).tofile(val)
        return (
            [],
            f"data.vocab_size=50 is not allowed; {val} holds token id 50: expected at least 51",
        )
    if kind == "vocab-too-small":
        return (
            ["data.vocab_size=40"],
            "data.vocab_size=40 is not allowed; the token ids go up to 49 (meta.json's max_token_id): expected at least 50",
        )
    if kind == "meta-unreadable":
        (folder / "meta.json").write_text('{"vocab_size": 50,')
        return [], f"{path}{folder / 'meta.json'} cannot be read: Expecting property name"
    if kind == "too-many-windows":  # 136 tokens: 8 windows of 17
        return (
            ["data.num_samples=9"],
            "data.num_samples=9 is not allowed; the file holds 8 windows of block_size + 1 = 17 tokens (null: all of them)",
        )
    if kind == "no-val":
        val.unlink()
        return (
            [],
            f"{path}it has no val.bin; expected train.bin and val.bin, as scripts/prepare_text.py writes them (or data.num_val_samples=0: no validation)",
        )
    if kind == "block-too-long":
        return (
            ["data.block_size=64"],
            f"data.block_size=64 is not allowed; {val} holds 64 tokens, fewer than one window of block_size + 1 = 65",
        )
    assert kind == "no-folder"
    return (
        [f"data.path={root / 'nowhere'}"],
        f"data.path='{root / 'nowhere'}' is not allowed; no such folder; point it at a folder with train.bin and val.bin",
    )


BAD = [
    "odd-bytes",
    "wrong-dtype",
    "id-above-record",
    "id-beyond-vocab",
    "vocab-too-small",
    "no-val",
    "block-too-long",
    "meta-unreadable",
    "too-many-windows",
    "no-folder",
]


@pytest.mark.parametrize("kind", BAD)
def test_bad_token_files_stop_before_training_with_one_line(tmp_path, kind):
    # what train.py checks before Hydra makes a run folder (check_config), and what the
    # source checks again when fit builds it; the command line's exit code is the next test's
    overrides, expected = _bad_folder(kind, tmp_path)
    args = ("task=lm", "data=tokens", f"data.path={tmp_path / 'd'}", "data.block_size=16")
    cfg = make_cfg(*args, *overrides, tiny=False)
    with pytest.raises(ConfigError) as error:
        check_config(cfg)
    assert str(error.value).startswith(expected), str(error.value)
    source = {k: v for k, v in cfg.data.items() if k not in ("_target_", "on_device", "stage_to")}
    with pytest.raises(ConfigError) as error:
        token_files(**source)  # as data/sources.py build_datasets calls it
    assert str(error.value).startswith(expected)


@pytest.mark.parametrize(
    "kind", ["odd-bytes", *(pytest.param(k, marks=pytest.mark.slow) for k in BAD[1:])]
)
def test_bad_token_files_are_one_line_exit_2_and_no_run_folder(tmp_path, kind):
    overrides, expected = _bad_folder(kind, tmp_path)
    (tmp_path / "work").mkdir()
    args = [
        "task=lm",
        "data=tokens",
        f"data.path={tmp_path / 'd'}",
        "data.block_size=16",
        *overrides,
    ]
    result = train_in_process(*args, "logger=none", cwd=tmp_path / "work")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {expected}"), result.stderr
    assert list((tmp_path / "work").iterdir()) == []  # no runs/, nothing half-written


def _prepared(tmp_path: Path, sentences: int = 120) -> Path:
    (tmp_path / "text.txt").write_text(grammar_text(sentences))
    prepare_text.prepare(tmp_path / "text.txt", tmp_path / "tokens")
    return tmp_path / "tokens"


def test_stop_mid_epoch_then_resume_equals_an_uninterrupted_run(tmp_path):
    # ~3400 training tokens: 212 windows of 16 = 14 batches of 16 = 7 steps an epoch (accum 2)
    folder = _prepared(tmp_path)
    gears = ("accum=2", "max_steps=16", "optimizer=adamw", "optimizer.lr=0.05")
    whole = fit(tokens_cfg(folder, *gears), tmp_path / "whole")
    cfg = partial(tokens_cfg, folder, *gears)
    saved, resumed = stop_and_resume(cfg, tmp_path / "stopped", step=10)
    assert saved["position"]["epoch"] == 1 and saved["position"]["epoch_samples"] == 6 * 16
    assert_same_parameters(resumed.model, whole.model)
    assert resumed.summary["val_loss"] == whole.summary["val_loss"]


def _first_tokens(batches) -> list[int]:
    return [int(t) for inputs, _ in batches for t in inputs[:, 0]]


def test_two_ranks_take_disjoint_windows_that_cover_the_epoch(tmp_path):
    folder = token_folder(tmp_path / "d", np.arange(64 * 16 + 1 + 64), vocab_size=2000)
    cfg = tokens_cfg(folder, "batch_size=8")  # 64 windows: 32 a rank, 4 batches
    for epoch in (0, 1):
        shares = []
        for rank in (0, 1):
            train, _ = data_batches(cfg, CPU, rank=rank, world_size=2)
            train.set_epoch(epoch)
            shares.append(_first_tokens(train))
        assert len(shares[0]) == len(shares[1]) == 32
        assert not set(shares[0]) & set(shares[1])
        assert sorted(shares[0] + shares[1]) == list(range(0, 64 * 16, 16))  # every window once
    assert shares[0] != sorted(shares[0])  # shuffled, by (seed, epoch)


def test_loader_workers_serve_the_same_batches(tmp_path):
    folder = _prepared(tmp_path, sentences=40)
    plain, _ = data_batches(tokens_cfg(folder, "dataloader.drop_last=true"), CPU)  # as tuned
    workers, _ = data_batches(
        tokens_cfg(folder, "dataloader=tuned", "dataloader.num_workers=2"), CPU
    )
    for batches in (plain, workers):
        batches.set_epoch(1, start=2 * 16)  # after two batches of 16
    for (a, b), (c, d) in zip(plain, workers, strict=True):
        assert torch.equal(a, c) and torch.equal(b, d)


def test_tokens_per_sec_in_the_summary_wandb_metrics_and_console(tmp_path, monkeypatch):
    logged = record_logs(monkeypatch)
    cfg = tokens_cfg(
        _prepared(tmp_path, sentences=40), "max_steps=6", "log_every_n_steps=3", "warmup_steps=3"
    )
    summary = fit(cfg, tmp_path / "run").summary
    assert summary["tokens_per_sec"] == pytest.approx(16 * summary["samples_per_sec"])
    assert summary["tokens_per_sec_per_device"] == pytest.approx(
        16 * summary["samples_per_sec_per_device"]
    )
    train_rows = [m for m in logged if "perf/samples_per_sec" in m]
    assert len(train_rows) == 2  # steps 3 and 6
    for row in train_rows:
        assert row["perf/tokens_per_sec"] == pytest.approx(16 * row["perf/samples_per_sec"])
    console = Console(record=True, width=200)
    print_summary(summary, console)
    assert re.search(r"tokens/s per device\s*│\s*[\d,.]+ │", console.export_text())
    image = fit(make_cfg("model=mlp", "max_steps=2"), tmp_path / "image").summary
    assert "tokens_per_sec" not in image  # a sample of an image task is not tokens


@pytest.mark.timeout(seconds(240))
def test_a_gpt_learns_a_grammar_well_below_the_unigram_entropy(tmp_path):
    # 1500 sentences of the grammar (~47K characters, 28 distinct), written by prepare_text.py
    text = grammar_text(1500)
    (tmp_path / "text.txt").write_text(text)
    prepare_text.prepare(tmp_path / "text.txt", tmp_path / "tokens")
    unigram, bigram = unigram_entropy(text), bigram_entropy(text)  # ~2.89 and ~1.65 nats
    # The threshold: half the unigram entropy (~1.44 nats per character), i.e. at least half
    # of the uncertainty that the characters' frequencies leave is removed. It lies below the
    # bigram entropy too, so it cannot be met from the previous character alone: the model
    # must spell words and follow the grammar from the context. The grammar's own entropy is
    # ~0.22 nats per character (6 x 6 x 6 x 4 equally likely sentences of ~31 characters).
    # Measured: 1.38 after 60 steps, 0.75 after 100, 0.40 after 160 (uniform: log 28 = 3.33).
    threshold = unigram / 2
    assert threshold < bigram
    cfg = make_cfg(
        "logger=none",
        "progress_bar=false",
        "task=lm",
        "data=tokens",
        f"data.path={tmp_path / 'tokens'}",
        "data.block_size=32",
        "data.num_val_samples=64",
        "model=gpt",  # the tiny preset, narrowed to 2 layers of 64 to fit a test's budget
        "model.n_layer=2",
        "model.n_embd=64",
        "batch_size=16",
        "max_steps=100",
        "optimizer=adamw",
        "optimizer.lr=3e-3",
        "optimizer.weight_decay=0",
        "optimizer.schedule=constant",
        tiny=False,
    )
    summary = fit(cfg, tmp_path / "run").summary
    assert summary["val_loss"] < threshold, (summary["val_loss"], unigram, bigram)


def test_big_files_with_a_recorded_max_are_sampled_others_scanned_whole(tmp_path, monkeypatch):
    # the sizes scaled down: "big" is above 1000 tokens here; 8 sampled chunks of 100 tokens
    monkeypatch.setattr(token_files_module, "FULL_SCAN_TOKENS", 1000)
    monkeypatch.setattr(token_files_module, "SAMPLED_CHUNKS", 8)
    monkeypatch.setattr(token_files_module, "SAMPLED_CHUNK_TOKENS", 100)
    ids = np.arange(5064) % 50
    ids[0], ids[2050] = 60, 70  # in the first sampled chunk; between two chunks
    folder = token_folder(tmp_path / "d", ids, vocab_size=100, max_token_id=49)
    message = "train.bin holds token id 60, above meta.json's max_token_id 49"
    with pytest.raises(ConfigError, match=re.escape(message)):  # the sample finds the first
        check_token_folder(str(folder), 16, 100)
    meta = json.loads((folder / "meta.json").read_text())
    del meta["max_token_id"]
    (folder / "meta.json").write_text(json.dumps(meta))
    message = (
        "data.vocab_size=65 is not allowed; " + str(folder / "train.bin") + " holds token id 70"
    )
    with pytest.raises(ConfigError, match=re.escape(message)):  # no record: every id is read
        check_token_folder(str(folder), 16, 65)
