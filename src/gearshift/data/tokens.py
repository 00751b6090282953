"""Token sources for `task=lm`: sequences of token ids served as windows of
`block_size + 1` tokens, split into inputs (the first `block_size`) and targets (the last
`block_size`, shifted by one).

`data=synthetic_tokens` needs no file: a token stream drawn from a fixed random Markov
chain in which every token has a few likely successors, so a model can learn it and its
entropy rate (the best loss any model can reach) is known.

`data=tokens` reads token files in nanoGPT's layout (`train.bin`, `val.bin`, a meta file;
checked by config/token_files.py) through `np.memmap`: window i of a file is its tokens
`i * block_size` to `(i + 1) * block_size` inclusive, so an epoch predicts every token of
the file once. The order of the windows is the loader's (data/host_loader.py `EpochSampler`:
a function of seed and epoch, sharded by rank, able to start mid-epoch).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from gearshift.config.token_files import check_token_folder, check_window_limit, window_count
from gearshift.data.synthetic import TensorPairs, _pairs_or_none, _split_generator


def markov_chain(vocab_size: int, successors: int, seed: int) -> torch.Tensor:
    """A (vocab, vocab) transition matrix: each row puts its mass on `successors` tokens."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.rand(vocab_size, successors, generator=g) + 0.5
    columns = torch.stack(
        [torch.randperm(vocab_size, generator=g)[:successors] for _ in range(vocab_size)]
    )
    matrix = torch.zeros(vocab_size, vocab_size)
    matrix.scatter_(1, columns, weights)
    return matrix / matrix.sum(dim=1, keepdim=True)


def entropy_rate(matrix: torch.Tensor) -> float:
    """The chain's entropy per token in nats, under its stationary distribution."""
    stationary = torch.full((len(matrix),), 1.0 / len(matrix), dtype=torch.float64)
    for _ in range(1000):
        stationary = stationary @ matrix.double()
    logs = torch.where(matrix > 0, matrix.double().log(), 0.0)
    return float(-(stationary[:, None] * matrix.double() * logs).sum())


def synthetic_tokens(
    num_samples: int = 2048,
    num_val_samples: int = 256,
    block_size: int = 64,
    vocab_size: int = 64,
    successors: int = 4,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> tuple[TensorPairs, TensorPairs | None]:
    """`num_samples` windows of `block_size + 1` tokens walked along one Markov chain
    (train and validation: the same chain, different walks)."""
    matrix = markov_chain(vocab_size, successors, seed)

    cumulative = matrix.cumsum(dim=1)

    def split(n: int, index: int) -> TensorPairs:
        # n windows walked side by side, each from a uniform first token: block_size steps
        g = _split_generator(seed, index, torch.device("cpu"))
        windows = torch.empty(n, block_size + 1, dtype=torch.long)
        windows[:, 0] = torch.randint(vocab_size, (n,), generator=g)
        draws = torch.rand(block_size, n, 1, generator=g)
        for i in range(block_size):
            rows = cumulative[windows[:, i]]
            windows[:, i + 1] = torch.searchsorted(rows, draws[i]).squeeze(1)
        windows.clamp_(max=vocab_size - 1)  # a draw above a row's rounded total
        return TensorPairs(windows[:, :-1].to(device), windows[:, 1:].to(device))

    return split(num_samples, 0), _pairs_or_none(split(num_val_samples, 1))


class TokenWindows(Dataset):
    """Windows of `block_size + 1` tokens of one .bin file: (inputs, targets) int64 tensors of
    `block_size` tokens, the targets shifted by one. The file is mapped lazily in each
    process that reads it (a DataLoader worker maps its own), never copied whole."""

    def __init__(self, file: Path, dtype: str, block_size: int, starts: np.ndarray) -> None:
        self.file, self.dtype, self.block_size, self.starts = file, dtype, block_size, starts
        self._tokens: np.memmap | None = None
        self._pid: int | None = None

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._pid != os.getpid():  # first read here, or a forked worker: map it anew
            self._tokens, self._pid = np.memmap(self.file, dtype=self.dtype, mode="r"), os.getpid()
        start = int(self.starts[index])
        window = self._tokens[start : start + self.block_size + 1]
        window = torch.from_numpy(window.astype(np.int64))  # tip 6: no copy beyond the cast
        return window[:-1], window[1:]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tokens": None, "_pid": None}  # a spawned worker maps its own


def window_starts(tokens: int, block_size: int, limit: int | None, key: str) -> np.ndarray:
    """Where each window begins: every block_size tokens, or `limit` of them spread evenly."""
    check_window_limit(limit, tokens, block_size, key)
    count = window_count(tokens, block_size)
    index = np.arange(count) if limit is None else np.linspace(0, count - 1, limit).round()
    return index.astype(np.int64) * block_size


def token_files(
    path: str,
    block_size: int,
    vocab_size: int,
    num_samples: int | None = None,
    num_val_samples: int | None = None,
) -> tuple[TokenWindows, TokenWindows | None]:
    """data=tokens: the windows of `path`/train.bin and val.bin (`num_val_samples=0`: no
    validation, val.bin not needed); `num_samples` windows spread evenly over the file, or all."""
    folder = check_token_folder(path, block_size, vocab_size, need_val=num_val_samples != 0)

    def split(name: str, limit: int | None, key: str) -> TokenWindows:
        starts = window_starts(folder.tokens[name], block_size, limit, key)
        return TokenWindows(folder.file(name), folder.dtype, block_size, starts)

    train = split("train", num_samples, "num_samples")
    return train, (
        None if num_val_samples == 0 else split("val", num_val_samples, "num_val_samples")
    )
