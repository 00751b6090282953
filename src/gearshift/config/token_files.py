"""Token files (`data=tokens`): a folder in nanoGPT's layout, read and checked before training.

The folder holds `train.bin` and `val.bin`, flat arrays of token ids (uint16, or uint32 when
the vocabulary needs it), and a metadata file: `meta.json` as scripts/prepare_text.py
writes it (`vocab_size`, `dtype`, `tokenizer`, `max_token_id`, the token counts and, for
characters, the table that decodes them), or nanoGPT's own `meta.pkl`, read as plain values
only (no classes, so no code runs).

This lives in the config layer because the config needs it before anything is built:
`data.vocab_size` defaults to the meta file's through the resolver
`${gearshift_token_vocab:${data.path}}` (registered by config/targets.py, which loads
this module when it is first used), and `check_config` checks the files, so a bad
folder ends the run with one line before any run folder exists. `data/tokens.py` serves
the windows.

The largest token id must be below `data.vocab_size`. A file of up to `FULL_SCAN_TOKENS`
tokens is scanned whole (numpy, in chunks: about 0.1 s for 64M tokens). A bigger one is
scanned whole only when the meta file records no `max_token_id`; with one, the record is
checked against the vocabulary and `SAMPLED_CHUNKS` evenly spaced chunks are checked
against the record, which catches a file replaced or written in another dtype without
reading gigabytes at every start. Either way the answer is kept per file (path, size,
modification time) for the life of the process.
"""

from __future__ import annotations

import functools
import json
import logging
import pickle
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from gearshift.config.rules import ConfigError

log = logging.getLogger(__name__)

SPLITS = ("train", "val")
DTYPES = ("uint16", "uint32")
FULL_SCAN_TOKENS = 2**26  # files up to this size have every id checked
SAMPLED_CHUNKS, SAMPLED_CHUNK_TOKENS = 64, 2**16  # bigger files with a recorded max_token_id
SCAN_CHUNK_TOKENS = 2**24  # the chunk a whole-file scan reads at a time (32 MiB as uint16)


def dtype_for(vocab_size: int) -> str:
    """nanoGPT's rule: uint16 holds ids below 65536, beyond that uint32."""
    return "uint16" if vocab_size <= 2**16 else "uint32"


class _PlainUnpickler(pickle.Unpickler):
    """Reads dicts, lists, strings and numbers; refuses any class (which could run code)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"it names {module}.{name}; only plain values are read")


def read_meta(folder: Path) -> tuple[dict[str, Any], str] | None:
    """(the metadata, the file it came from): meta.json, else nanoGPT's meta.pkl; None
    when there is neither. A file that cannot be read raises ConfigError."""
    for name in ("meta.json", "meta.pkl"):
        file = folder / name
        if not file.is_file():
            continue
        try:
            if name == "meta.json":
                meta = json.loads(file.read_text(encoding="utf-8"))
            else:
                with file.open("rb") as stream:
                    meta = _PlainUnpickler(stream).load()
        except (OSError, ValueError, pickle.UnpicklingError, EOFError) as error:
            raise ConfigError(
                f"data.path={str(folder)!r} is not allowed; {file} cannot be read: {error}"
            ) from None
        if not isinstance(meta, dict):
            raise ConfigError(
                f"data.path={str(folder)!r} is not allowed; {file} holds a "
                f"{type(meta).__name__}, expected a mapping with vocab_size"
            )
        return meta, name
    return None


def meta_value(path: str | None, key: str) -> object:
    """`key` of the token folder's meta file, or None (no folder, no meta file, an
    unreadable one: check_config then says which)."""
    if not path:
        return None
    try:
        found = read_meta(Path(path).expanduser())
    except ConfigError:
        return None
    return found[0].get(key) if found else None


def meta_vocab_size(path: str | None) -> int | None:
    """The resolver behind `data.vocab_size` of data=tokens: the meta file's vocab_size."""
    vocab = meta_value(path, "vocab_size")
    return vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else None


def meta_bytes_per_token(path: str | None) -> float | None:
    """The resolver behind `task.bytes_per_token` of task=lm: the UTF-8 bytes per token
    scripts/prepare_text.py records, or None (the task then reports no bits per byte)."""
    value = meta_value(path, "bytes_per_token")
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if number and value > 0 else None


@dataclass(frozen=True)
class TokenFolder:
    """A checked folder: where each split's file is, its dtype and its length in tokens."""

    path: Path
    dtype: str
    tokens: dict[str, int]  # per split present
    meta: dict[str, Any]

    def file(self, split: str) -> Path:
        return self.path / f"{split}.bin"


def check_token_folder(
    path: str | None, block_size: Any, vocab_size: Any, need_val: bool = True
) -> TokenFolder:
    """The folder `data.path` names, checked for data=tokens; ConfigError (one line) for the
    first problem: no folder, an unreadable meta file, a missing split, a byte count or
    token count that does not fit the dtype, a file shorter than one window, a token id
    that does not fit the vocabulary."""
    if not path:
        raise ConfigError(
            "data.path=None is not allowed; data=tokens reads a folder of token files: set "
            "data.path=/path/to/it (scripts/prepare_text.py FILE OUTDIR makes one)"
        )
    folder = Path(path).expanduser()
    where = f"data.path={path!r} is not allowed; "
    if not folder.is_dir():
        what = "not a folder" if folder.exists() else "no such folder"
        raise ConfigError(f"{where}{what}; point it at a folder with train.bin and val.bin")
    meta, meta_name = read_meta(folder) or ({}, "meta.json")  # an unreadable one: its error
    for key, value in (("data.block_size", block_size), ("data.vocab_size", vocab_size)):
        if not _is_int(value, 1):
            if key == "data.vocab_size" and value is None:
                raise ConfigError(
                    f"data.vocab_size=None is not allowed; {folder} has no meta.json or "
                    "meta.pkl with a vocab_size: set data.vocab_size=N"
                )
            raise ConfigError(f"{key}={value!r} is not allowed; expected an integer >= 1")
    for key in ("vocab_size", "max_token_id", "train_tokens", "val_tokens"):
        if key in meta and not _is_int(meta[key], 0):
            raise ConfigError(
                f"{where}{folder / meta_name} says {key} {meta[key]!r}; expected an integer >= 0"
            )
    dtype = meta.get("dtype") or dtype_for(meta.get("vocab_size", vocab_size))
    if dtype not in DTYPES:
        raise ConfigError(
            f"{where}{folder / meta_name} says dtype {dtype!r}; choose one of: {', '.join(DTYPES)}"
        )
    tokens = {
        split: _split_tokens(folder / f"{split}.bin", dtype, meta, meta_name, block_size, where)
        for split in (SPLITS if need_val else ("train",))
    }
    _check_ids(folder, tokens, dtype, vocab_size, meta.get("max_token_id"), meta_name, where)
    return TokenFolder(folder, dtype, tokens, meta)


def _split_tokens(
    file: Path, dtype: str, meta: dict[str, Any], meta_name: str, block_size: int, where: str
) -> int:
    """The tokens in one split's file: it exists, its size fits the dtype and the meta
    file's count, and it holds at least one window."""
    split = file.stem
    if not file.is_file():
        fix = " (or data.num_val_samples=0: no validation)" if split == "val" else ""
        raise ConfigError(
            f"{where}it has no {split}.bin; expected train.bin and val.bin, as "
            f"scripts/prepare_text.py writes them{fix}"
        )
    size, itemsize = file.stat().st_size, np.dtype(dtype).itemsize
    if size % itemsize:
        raise ConfigError(
            f"{where}{file} has {size} bytes, not a whole number of {dtype} tokens "
            f"({itemsize} bytes each): it is damaged, or written in another dtype"
        )
    tokens, recorded = size // itemsize, meta.get(f"{split}_tokens")
    if recorded is not None and recorded != tokens:
        raise ConfigError(
            f"{where}{file} holds {tokens} {dtype} tokens, {meta_name} says {recorded}: it is "
            "damaged, or written in another dtype"
        )
    if tokens < block_size + 1:
        raise ConfigError(
            f"data.block_size={block_size} is not allowed; {file} holds {tokens} tokens, "
            f"fewer than one window of block_size + 1 = {block_size + 1}"
        )
    return tokens


def _check_ids(
    folder: Path,
    tokens: dict[str, int],
    dtype: str,
    vocab_size: int,
    recorded_max: int | None,
    meta_name: str,
    where: str,
) -> None:
    """Every token id below vocab_size (and, where recorded, at most max_token_id)."""
    if recorded_max is not None and recorded_max >= vocab_size:
        raise ConfigError(
            f"data.vocab_size={vocab_size} is not allowed; the token ids go up to "
            f"{recorded_max} ({meta_name}'s max_token_id): expected at least {recorded_max + 1}"
        )
    for split, count in tokens.items():
        file = folder / f"{split}.bin"
        sampled = count > FULL_SCAN_TOKENS and recorded_max is not None
        stat = file.stat()
        largest = _largest_id(str(file), dtype, stat.st_size, stat.st_mtime_ns, sampled)
        if recorded_max is not None and largest > recorded_max:
            raise ConfigError(
                f"{where}{file} holds token id {largest}, above {meta_name}'s max_token_id "
                f"{recorded_max}: it is damaged, or written in another dtype than {dtype}"
            )
        if largest >= vocab_size:
            raise ConfigError(
                f"data.vocab_size={vocab_size} is not allowed; {file} holds token id "
                f"{largest}: expected at least {largest + 1} (a damaged file, or one "
                f"written in another dtype than {dtype}, also does this)"
            )


def _is_int(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def window_count(tokens: int, block_size: int) -> int:
    """Windows of block_size + 1 tokens, each starting block_size after the last."""
    return (tokens - 1) // block_size


@functools.lru_cache(maxsize=16)
def _largest_id(file: str, dtype: str, size: int, mtime_ns: int, sampled: bool) -> int:
    """The largest id in the file (sampled: in evenly spaced chunks); size and mtime key the
    cache, so a file changed on disk is read again."""
    ids = np.memmap(file, dtype=dtype, mode="r")
    if sampled:
        starts = np.linspace(0, len(ids) - SAMPLED_CHUNK_TOKENS, SAMPLED_CHUNKS).astype(np.int64)
        return max(int(ids[s : s + SAMPLED_CHUNK_TOKENS].max()) for s in starts)
    began = time.perf_counter()
    largest = max(
        int(ids[s : s + SCAN_CHUNK_TOKENS].max()) for s in range(0, len(ids), SCAN_CHUNK_TOKENS)
    )
    if len(ids) > FULL_SCAN_TOKENS:
        log.info(
            "scanned %s (%d tokens) for its largest id in %.1f s; record max_token_id in the "
            "meta file to check a sample instead",
            file,
            len(ids),
            time.perf_counter() - began,
        )
    return largest


def check_token_config(cfg: DictConfig) -> None:
    """check_config's part for data=tokens: the data node's values, then the folder."""
    data = cfg.data
    if data.get("on_device"):
        raise ConfigError(
            "data.on_device=True is not allowed; token files are read through the DataLoader"
        )
    for key, minimum in (("num_samples", 1), ("num_val_samples", 0)):
        value = data.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < minimum
        ):
            raise ConfigError(
                f"data.{key}={value!r} is not allowed; expected an integer >= {minimum} "
                "(or null: every window)"
            )
    folder = check_token_folder(
        data.path, data.block_size, data.vocab_size, need_val=data.get("num_val_samples") != 0
    )
    for split, key in (("train", "num_samples"), ("val", "num_val_samples")):
        check_window_limit(data.get(key), folder.tokens.get(split, 0), data.block_size, key)


def check_window_limit(limit: int | None, tokens: int, block_size: int, key: str) -> None:
    """data.num_samples / num_val_samples: no more windows than the file holds."""
    count = window_count(tokens, block_size)
    if limit is not None and limit > max(count, 0):
        raise ConfigError(
            f"data.{key}={limit} is not allowed; the file holds {count} windows of "
            f"block_size + 1 = {block_size + 1} tokens (null: all of them)"
        )
