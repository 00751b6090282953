"""Text to token files and back: the tokenizers of scripts/prepare_text.py.

`CharTokenizer` (the default, no dependency) gives every distinct character of the text an
id, in code-point order, and keeps the table in the meta file so that `decode` works.
`Gpt2Tokenizer` is GPT-2's byte-pair encoding through tiktoken, an optional extra
(`pip install 'gearshift[lm]'`). `write_token_folder` writes nanoGPT's layout, which
data=tokens reads (config/token_files.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from gearshift.config import ConfigError
from gearshift.config.token_files import dtype_for, read_meta


class CharTokenizer:
    name = "char"

    def __init__(self, chars: str) -> None:
        self.chars = chars
        self.codes = np.frombuffer(chars.encode("utf-32-le"), dtype="<u4")  # sorted code points
        self.vocab_size = len(chars)

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        codes = np.unique(np.frombuffer(text.encode("utf-32-le"), dtype="<u4"))
        return cls(codes.astype("<u4").tobytes().decode("utf-32-le"))

    def encode(self, text: str) -> np.ndarray:
        codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
        ids = np.searchsorted(self.codes, codes)
        known = self.codes[np.minimum(ids, len(self.codes) - 1)] == codes
        if not known.all():
            lacking = "".join(dict.fromkeys(_text(codes[~known])))  # each once, in order
            shown = self.chars if len(self.chars) <= 40 else f"{self.chars[:40]}..."
            raise ValueError(
                f"the text holds characters the table lacks: {lacking!r} "
                f"(its {len(self.chars)} characters: {shown!r})"
            )
        return ids

    def decode(self, ids: np.ndarray) -> str:
        return _text(self.codes[np.asarray(ids, dtype=np.int64)])

    def meta(self) -> dict[str, Any]:
        return {"tokenizer": self.name, "chars": self.chars}


def _text(codes: np.ndarray) -> str:
    """Code points back to a string."""
    return codes.astype("<u4").tobytes().decode("utf-32-le")


class Gpt2Tokenizer:
    name = "gpt2"

    def __init__(self) -> None:
        try:
            import tiktoken
        except ImportError:
            raise ConfigError(
                "--tokenizer gpt2 needs tiktoken, an optional extra: "
                "pip install 'gearshift[lm]' (or pip install tiktoken)"
            ) from None
        try:
            self.encoding = tiktoken.get_encoding("gpt2")
        except Exception as error:  # its vocabulary is downloaded once, then cached
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise ConfigError(
                f"--tokenizer gpt2: tiktoken could not load GPT-2's vocabulary "
                f"({type(error).__name__}: {first}); it downloads it once, then caches it"
            ) from None
        self.vocab_size = self.encoding.n_vocab  # GPT-2's 50257

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.encoding.encode_ordinary(text), dtype=np.int64)

    def decode(self, ids: np.ndarray) -> str:
        return self.encoding.decode([int(i) for i in ids])

    def meta(self) -> dict[str, Any]:
        return {"tokenizer": self.name}


TOKENIZERS = {"char": CharTokenizer, "gpt2": Gpt2Tokenizer}


def tokenizer_from_meta(meta: dict[str, Any]) -> CharTokenizer | Gpt2Tokenizer:
    """The tokenizer a meta file describes: ours (meta.json) or nanoGPT's meta.pkl (itos)."""
    if meta.get("tokenizer") == "gpt2":
        return Gpt2Tokenizer()
    if "chars" in meta:
        return CharTokenizer(meta["chars"])
    if "itos" in meta:  # nanoGPT's character table: {id: char}
        return CharTokenizer("".join(meta["itos"][i] for i in range(len(meta["itos"]))))
    raise ValueError(f"the meta file names no tokenizer this can decode: {sorted(meta)}")


class IdCodec:
    """Data without a vocabulary: prompts and samples are token ids separated by spaces."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def encode(self, text: str) -> np.ndarray:
        try:
            ids = np.asarray([int(word) for word in text.split()], dtype=np.int64)
        except ValueError:
            ids = np.asarray([-1])
        if (ids < 0).any() or (ids >= self.vocab_size).any():
            raise ValueError(
                f"this data has no vocabulary: give token ids below {self.vocab_size}, "
                "separated by spaces"
            )
        return ids

    def decode(self, ids: np.ndarray) -> str:
        return " ".join(str(int(i)) for i in ids)


def codec_for(data: Any) -> CharTokenizer | Gpt2Tokenizer | IdCodec:
    """The vocabulary of a run's data (its `data` node): the token folder's meta file, or
    token ids (data=synthetic_tokens, a folder whose meta file has no table)."""
    path = data.get("path") if "path" in data else None
    if path is not None:
        found = read_meta(Path(path).expanduser())
        if found is not None:
            try:
                return tokenizer_from_meta(found[0])
            except ValueError:
                pass  # a meta file without a table: ids
    return IdCodec(int(data.vocab_size))


def write_token_folder(
    folder: Path, splits: dict[str, np.ndarray], vocab_size: int, meta: dict[str, Any]
) -> dict[str, Any]:
    """train.bin, val.bin and meta.json in `folder`; returns the meta written. The old
    meta.json goes first and the new one comes last, each file through a rename, so a
    write cut short leaves no folder that reads as complete."""
    folder.mkdir(parents=True, exist_ok=True)
    dtype = dtype_for(vocab_size)
    meta = {
        "vocab_size": vocab_size,
        "dtype": dtype,
        **meta,
        "max_token_id": max(int(ids.max()) for ids in splits.values()),
        **{f"{name}_tokens": len(ids) for name, ids in splits.items()},
    }
    (folder / "meta.json").unlink(missing_ok=True)
    for name, ids in splits.items():
        _replace(folder / f"{name}.bin", ids.astype(dtype).tobytes())
    _replace(folder / "meta.json", (json.dumps(meta, indent=1) + "\n").encode())
    return meta


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
