"""Token sources for `task=lm`: sequences of token ids served as windows of
`block_size + 1` tokens, split into inputs (the first `block_size`) and targets (the last
`block_size`, shifted by one).

`data=synthetic_tokens` needs no file: a token stream drawn from a fixed random Markov
chain in which every token has a few likely successors, so a model can learn it and its
entropy rate (the best loss any model can reach) is known.
"""

from __future__ import annotations

import torch

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
