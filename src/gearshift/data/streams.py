"""Iterable sources (`IterableDataset`): split over ranks and loader workers, each sample
once, and resumed exactly without reading the past again.

**The stream protocol** (`Stream`, for shards, Parquet/Arrow files, a database's pages):
a stream is made of *pieces* of known length (a shard, a file) and can start reading a
piece at any offset (`read(piece, offset)`: a seek, not a pass over what comes before).
From that, the loader numbers an epoch's samples 0..N-1 in the epoch's order
(`EpochOrder`: the pieces shuffled by (seed, epoch); inside a piece, blocks of
`shuffle_block` samples shuffled by (seed, epoch, piece, block): the stream's shuffle
buffer) and deals them out as *ranges* of that numbering:

- the epoch's remaining ranges are split over ranks (equal shares; the last padded from
  the start, as map-style data is) and, inside a rank, over its loader workers, so that the
  DataLoader's in-order round robin (local batch k from worker k % workers) meets each
  worker's batches in order (`rank_work`);
- from the number of batches a rank has taken, each worker's progress is known, so the
  job's remaining work is an ordered list of ranges (`remaining`): the position the
  checkpoint keeps (`Position.state_dict()["stream"]`, JSON-able, global, not per rank);
- a resumed run deals that list out again: on the same ranks, workers and batch size the
  same samples in the same order (bit-exact); on others, each remaining sample once. A
  worker seeks to its first range and re-reads at most one shuffle block.

A plain `IterableDataset` (no protocol) trains too. With `__len__`, it is one piece read
from its start: each worker skips to its share by reading past the samples before it
(and a resumed run reads the trained ones again to skip them: exact, but not O(1); it
says so). Without `__len__`, its length is unknown: every slot (rank x worker) keeps
every S-th sample of an endless pass over it, `max_steps` must end the run, and a resume
starts it again from its beginning (it says so).
"""

from __future__ import annotations

import bisect
import itertools
import logging
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from gearshift.config import ConfigError
from gearshift.data.sources import stream_length, worker_seed

log = logging.getLogger(__name__)

Ranges = list[list[int]]  # [[begin, end], ...] of an epoch's sample numbers, in order
_MIX = 1_000_003  # a prime: (seed, epoch, piece, block) tuples map to distinct seeds


class Stream(IterableDataset):
    """Subclass for a stream that resumes in O(1). Implement `piece_lengths` and `read`.

    `piece_lengths()`: the samples in each piece, in storage order (the same on every
    rank and every call). `read(piece, offset)`: an iterator over the piece's samples from
    `offset` on, seeking there (no pass over the samples before it). `shuffle_block`:
    samples per shuffle block (the buffer a worker holds; 0 or 1: pieces in order).
    `set_epoch(epoch)` is called, where defined, before each epoch's reads.
    """

    shuffle_block: int = 1024

    def piece_lengths(self) -> Sequence[int]:
        raise NotImplementedError

    def read(self, piece: int, offset: int) -> Iterator[Any]:
        raise NotImplementedError

    def __len__(self) -> int:
        return sum(self.piece_lengths())

    def __iter__(self) -> Iterator[Any]:  # outside training: every piece, in order
        for piece in range(len(self.piece_lengths())):
            yield from self.read(piece, 0)

    def first_sample(self) -> Any:
        lengths = self.piece_lengths()
        piece = next((i for i, n in enumerate(lengths) if n), None)
        return None if piece is None else next(iter(self.read(piece, 0)))


def seekable(dataset: Any) -> bool:
    return isinstance(dataset, Stream)


class EpochOrder:
    """The epoch's sample numbers 0..N-1 -> (piece, offset) reads, in (seed, epoch) order."""

    def __init__(
        self, lengths: Sequence[int], epoch: int, seed: int, shuffle: bool, block: int
    ) -> None:
        self.lengths, self.epoch, self.seed = list(lengths), epoch, seed
        self.block = block if shuffle and block > 1 else 0
        if shuffle:
            generator = torch.Generator().manual_seed(seed * _MIX + epoch)
            self.pieces = torch.randperm(len(self.lengths), generator=generator).tolist()
        else:
            self.pieces = list(range(len(self.lengths)))
        ends = list(itertools.accumulate(self.lengths[p] for p in self.pieces))
        self.starts, self.total = [0, *ends[:-1]], (ends[-1] if ends else 0)

    def block_order(self, piece: int, block: int, size: int) -> list[int]:
        """The shuffle of one block: a function of (seed, epoch, piece, block) alone."""
        key = ((self.seed * _MIX + self.epoch) * _MIX + piece) * _MIX + block
        generator = torch.Generator().manual_seed(key % 2**63)
        return torch.randperm(size, generator=generator).tolist()

    def samples(self, stream: Stream, begin: int, end: int) -> Iterator[Any]:
        """The samples numbered begin..end-1, reading each piece from where they start."""
        k = bisect.bisect_right(self.starts, begin) - 1
        while begin < end:
            piece, first = self.pieces[k], begin - self.starts[k]
            take = min(end, self.starts[k] + self.lengths[piece]) - begin
            if take > 0:
                yield from self._piece(stream, piece, first, take)
            begin += max(take, 0)
            k += 1

    def _piece(self, stream: Stream, piece: int, first: int, take: int) -> Iterator[Any]:
        if not self.block:
            yield from itertools.islice(stream.read(piece, first), take)
            return
        length, block = self.lengths[piece], first // self.block
        reader = stream.read(piece, block * self.block)  # a seek to the block's start
        while take > 0:
            size = min(self.block, length - block * self.block)
            buffer = list(itertools.islice(reader, size))  # the shuffle buffer: one block
            skip = first - block * self.block if first > block * self.block else 0
            for i in self.block_order(piece, block, size)[skip : skip + take]:
                yield buffer[i]
            take -= min(take, size - skip)
            block += 1


class _Plain(Stream):
    """A plain IterableDataset with a length, as one piece read from its start."""

    shuffle_block = 0

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def piece_lengths(self) -> Sequence[int]:
        return [len(self.dataset)]

    def read(self, piece: int, offset: int) -> Iterator[Any]:
        return itertools.islice(iter(self.dataset), offset, None)  # no seek: reads past

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)


def _take(ranges: Ranges, count: int) -> tuple[Ranges, Ranges]:
    """(the first `count` samples of `ranges`, the rest)."""
    head, rest = [], []
    for begin, end in ranges:
        if count <= 0:
            rest.append([begin, end])
        elif end - begin <= count:
            head.append([begin, end])
            count -= end - begin
        else:
            head.append([begin, begin + count])
            rest.append([begin + count, end])
            count = 0
    return head, rest


def _size(ranges: Ranges) -> int:
    return sum(end - begin for begin, end in ranges)


def _merged(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for begin, end in ranges:
        if end <= begin:
            continue
        if out and out[-1][1] == begin:
            out[-1][1] = end
        else:
            out.append([begin, end])
    return out


def worker_batches(batches: int, workers: int) -> list[int]:
    """Batches each worker serves when the loader takes batch k from worker k % workers."""
    return [len(range(w, batches, workers)) for w in range(workers)]


def rank_work(
    remaining: Ranges, rank: int, world_size: int, workers: int, batch_size: int, drop_last: bool
) -> list[Ranges]:
    """This rank's share of the epoch's `remaining` ranges, one list of ranges per worker.

    Every rank gets ceil(R / world_size) samples (the last share padded from the start of
    the remaining list); inside the rank, worker w gets the batches k with k % workers == w,
    as one contiguous stretch, so the loader's round robin meets them in order.
    """
    total = _size(remaining)
    share = -(-total // world_size)
    padded = remaining + _take(remaining, share * world_size - total)[0]
    _, rest = _take(padded, rank * share)
    mine, _ = _take(rest, share)
    if drop_last:
        mine, _ = _take(mine, share // batch_size * batch_size)
    count = _size(mine)
    batches = -(-count // batch_size)
    work = []
    for w, served in enumerate(worker_batches(batches, workers)):
        last = w == (batches - 1) % workers if batches else False
        size = served * batch_size - (batches * batch_size - count if last else 0)
        part, mine = _take(mine, size)
        work.append(part)
    return work


def remaining_after(work: list[Ranges], taken: int, batch_size: int) -> Ranges:
    """A rank's remaining ranges once it has taken `taken` batches, in the order a resume
    on the same layout deals them back: worker taken % W first (batch `taken` is its)."""
    workers = len(work)
    served = worker_batches(taken, workers)
    order = [(taken + i) % workers for i in range(workers)]
    return [r for w in order for r in _take(work[w], served[w] * batch_size)[1]]


class _Slots(IterableDataset):
    """What the DataLoader iterates: each worker reads its own ranges of the epoch."""

    def __init__(self, stream: Stream, block: int) -> None:
        self.stream, self.block = stream, block
        self.order: EpochOrder | None = None
        self.work: list[Ranges] = [[]]

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        ranges = self.work[info.id if info else 0]
        if hasattr(self.stream, "set_epoch"):
            self.stream.set_epoch(self.order.epoch)
        for begin, end in ranges:
            yield from self.order.samples(self.stream, begin, end)


class StreamBatches:
    """A DataLoader over a stream, with LoaderBatches' set_epoch/len interface and the
    stream's position (`stream_state` / `load_stream_state`, kept by Position)."""

    def __init__(
        self,
        loader: DataLoader,
        stream: Stream,
        shuffle: bool,
        seed: int,
        rank: int,
        world_size: int,
        drop_last: bool,
    ) -> None:
        self.loader, self.stream, self.slots = loader, stream, loader.dataset
        self.shuffle, self.seed, self.rank, self.world_size = shuffle, seed, rank, world_size
        self.batch_size, self.drop_last = loader.batch_size, drop_last
        self.workers = max(1, loader.num_workers)
        self.lengths = list(stream.piece_lengths())
        self.total = sum(self.lengths)
        self.resume: dict[str, Any] | None = None  # a checkpoint's position, until used
        self.set_epoch(0)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """`epoch`'s samples; from a checkpoint's remaining ranges when resuming it."""

        remaining = [[0, self.total]]
        if start and self.resume is not None and self.resume["epoch"] == epoch:
            remaining = [list(r) for r in self.resume["remaining"]]
        self.epoch, self.remaining = epoch, remaining
        self.work = rank_work(
            remaining, self.rank, self.world_size, self.workers, self.batch_size, self.drop_last
        )
        self.slots.order = EpochOrder(
            self.lengths, epoch, self.seed, self.shuffle, self.stream.shuffle_block
        )
        self.slots.work = self.work
        self.loader.generator.manual_seed(worker_seed(self.seed, self.rank, epoch))

    def __len__(self) -> int:
        """This rank's batches left in the epoch."""
        return -(-sum(_size(r) for r in self.work) // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)

    def stream_state(self, epoch: int, taken: int) -> dict[str, Any]:
        """The job's position in the stream after each rank took `taken` of this epoch's
        batches (or the next epoch's start): plain ints and lists, the same on every rank."""
        if epoch != self.epoch:
            return {"epoch": epoch, "remaining": [[0, self.total]]}
        left = []
        for rank in range(self.world_size):
            work = rank_work(
                self.remaining, rank, self.world_size, self.workers, self.batch_size,
                self.drop_last,
            )  # fmt: skip
            left += remaining_after(work, taken, self.batch_size)
        return {"epoch": epoch, "remaining": _merged(left)}

    def load_stream_state(self, state: dict[str, Any]) -> None:
        end = max((end for _, end in state["remaining"]), default=0)
        if end > self.total:  # the stream changed since the checkpoint
            raise ConfigError(
                f"resume: the checkpoint's stream position reaches sample {end} of epoch "
                f"{state['epoch']}, but {type(self.stream).__name__} now holds {self.total} "
                "samples; resume with the data it trained on, or start afresh (resume=null)"
            )
        self.resume = state
        if isinstance(self.stream, _Plain) and state["remaining"] != [[0, self.total]]:
            log.info(
                "resume: %s is a plain IterableDataset (no gearshift Stream pieces): its "
                "workers read the samples before their share again to skip them",
                type(self.stream.dataset).__name__,
            )


class _EveryNth(IterableDataset):
    """A stream of unknown length: slot s of S keeps every S-th sample, pass after pass."""

    def __init__(self, dataset: Any, rank: int, world_size: int, endless: bool) -> None:
        self.dataset, self.rank, self.world_size, self.endless = dataset, rank, world_size, endless

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        slots, slot = self.world_size * workers, self.rank * workers + worker
        for passes in itertools.count():
            if hasattr(self.dataset, "set_epoch"):
                self.dataset.set_epoch(passes)
            yield from itertools.islice(iter(self.dataset), slot, None, slots)
            if not self.endless:
                return


class EndlessBatches:
    """A stream of unknown length as one endless epoch; `max_steps` ends the run."""

    def __init__(self, loader: DataLoader, dataset: Any, seed: int, rank: int) -> None:
        self.loader, self.dataset, self.seed, self.rank = loader, dataset, seed, rank
        self.batch_size = loader.batch_size

    def set_epoch(self, epoch: int, start: int = 0) -> None:

        self.loader.generator.manual_seed(worker_seed(self.seed, self.rank, epoch))

    def __len__(self) -> int:
        return sys.maxsize  # no end: max_steps stops the run

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)

    def stream_state(self, epoch: int, taken: int) -> dict[str, Any]:
        return {"epoch": epoch, "unknown_length": True}

    def load_stream_state(self, state: dict[str, Any]) -> None:
        log.warning(
            "resume: %s has no length and no gearshift Stream pieces, so its position cannot "
            "be found again: it starts from its beginning",
            type(self.dataset).__name__,
        )


def check_length(dataset: Any, max_steps: int | None) -> None:
    """A stream of unknown length needs max_steps (no epoch can end it)."""
    if max_steps is None and stream_length(dataset) is None:
        raise ConfigError(
            f"max_steps=None is not allowed; the training stream {type(dataset).__name__} "
            "has no length (no __len__), so no epoch ends: set max_steps=N"
        )


def build_stream_batches(
    dataset: Any,
    loader_options: dict[str, Any],
    batch_size: int,
    train: bool,
    seed: int,
    rank: int,
    world_size: int,
    drop_last: bool,
) -> StreamBatches | EndlessBatches | DataLoader:
    """This rank's batches of an IterableDataset (`loader_options`: the DataLoader gears)."""
    options = dict(loader_options)
    if options.get("num_workers"):  # each epoch hands the workers new work: fresh workers
        options["persistent_workers"] = False
    generator = torch.Generator()
    if stream_length(dataset) is None:
        slots = _EveryNth(dataset, rank, world_size, endless=train)
        loader = DataLoader(slots, batch_size=batch_size, generator=generator, **options)
        return EndlessBatches(loader, dataset, seed, rank) if train else loader
    stream = dataset if seekable(dataset) else _Plain(dataset)
    slots = _Slots(stream, stream.shuffle_block)
    loader = DataLoader(slots, batch_size=batch_size, generator=generator, **options)
    return StreamBatches(loader, stream, train, seed, rank, world_size, drop_last and train)
