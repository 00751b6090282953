"""Iterable sources: dealt over ranks and loader workers with each sample once per epoch,
resumed exactly (on the same layout: the same samples in the same order; on another: each
remaining sample once) by seeking, not by reading the past; plain IterableDatasets train
too, and one of unknown length needs max_steps."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch
from helpers import make_cfg, run_train
from test_checkpoint import SignalAtStep
from torch.utils.data import IterableDataset

from gearshift.config import ConfigError
from gearshift.data.streams import EpochOrder, Stream, build_stream_batches
from gearshift.state.checkpoint_folders import latest_checkpoint
from gearshift.state.checkpoint_reads import load_checkpoint
from gearshift.state.preemption import TrainingStopped
from train import fit


class Numbers(Stream):
    """Pieces of known lengths whose samples carry their id; `read` seeks in O(1) and
    counts the samples it hands out (`reads`, per process)."""

    shuffle_block = 8

    def __init__(self, lengths: list[int], cost: int = 0) -> None:
        self.lengths, self.cost, self.reads = list(lengths), cost, 0
        self.starts = [sum(self.lengths[:i]) for i in range(len(self.lengths))]

    def piece_lengths(self) -> list[int]:
        return self.lengths

    def read(self, piece: int, offset: int):
        base = self.starts[piece]
        for i in range(base + offset, base + self.lengths[piece]):
            self.reads += 1
            x = torch.full((3, 4, 4), float(i % 7))
            for _ in range(self.cost):  # a sample that costs something to make
                x = x * 1.0
            yield {"x": x, "label": i % 10, "id": i}


class Sized(IterableDataset):
    """A plain IterableDataset (no protocol) with a length."""

    def __init__(self, n: int, length: bool = True) -> None:
        self.n, self.length = n, length

    def __iter__(self):
        for i in range(self.n):
            yield {"x": torch.full((3, 4, 4), float(i % 7)), "label": i % 10, "id": i}

    def __len__(self) -> int:
        if not self.length:
            raise TypeError("no length")
        return self.n


class Unsized(Sized):
    __len__ = None  # len() raises TypeError: a stream of unknown length


def source(kind: str = "stream", num_samples: int = 96, num_val_samples: int = 32, **_):
    if kind == "stream":
        return Numbers([num_samples // 4] * 4), Numbers([num_val_samples])
    if kind == "sized":
        return Sized(num_samples), Sized(num_val_samples)
    return Unsized(num_samples), Unsized(num_val_samples)


def batches_of(dataset, rank=0, world=1, workers=0, batch=8, train=True, seed=0):
    options = {"num_workers": workers, **({"prefetch_factor": 2} if workers else {})}
    return build_stream_batches(dataset, options, batch, train, seed, rank, world, False)


def ids(batches) -> list[int]:
    return [i for batch in batches for i in batch["id"].tolist()]


@pytest.mark.parametrize(("world", "workers"), [(1, 0), (2, 2)])
def test_an_epoch_is_dealt_to_ranks_and_workers_each_sample_once(world, workers):
    stream = Numbers([40, 24, 32])  # 96 samples in pieces of several lengths
    seen = {epoch: [] for epoch in (0, 1)}
    for rank in range(world):
        loader = batches_of(stream, rank, world, workers)
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            got = ids(loader)
            assert len(loader) == 96 // world // 8 and len(got) == 96 // world
            seen[epoch] += got
    assert sorted(seen[0]) == sorted(seen[1]) == list(range(96))
    assert seen[0] != seen[1]  # a shuffled stream: each epoch in its own order


def taken_then_rest(before: tuple[int, int, int], after: tuple[int, int, int], k: int):
    """Each rank of layout `before` (world, workers, batch) takes `k` batches; the position
    is saved and layout `after` reads the rest. Returns (taken, rest, rest of `before`)."""
    stream = Numbers([40, 24, 32])
    (world, workers, batch), taken, whole_rest = before, [], []
    for rank in range(world):
        loader = batches_of(stream, rank, world, workers, batch)
        loader.set_epoch(3)
        got = [b["id"].tolist() for b in loader]
        taken += [i for b in got[:k] for i in b]
        whole_rest.append([i for b in got[k:] for i in b])
    state = loader.stream_state(3, k)
    assert state["epoch"] == 3 and all(isinstance(x, int) for r in state["remaining"] for x in r)
    (world, workers, batch), rest = after, []
    for rank in range(world):
        resumed = batches_of(stream, rank, world, workers, batch)
        resumed.load_stream_state(state)
        resumed.set_epoch(3, start=len(taken))
        rest.append(ids(resumed))
    return taken, rest, whole_rest


def test_a_resume_on_the_same_layout_continues_the_same_samples_in_the_same_order():
    taken, rest, whole_rest = taken_then_rest((2, 2, 8), (2, 2, 8), k=3)
    assert rest == whole_rest  # per rank, batch for batch
    assert sorted(taken + [i for ids_ in rest for i in ids_]) == list(range(96))


@pytest.mark.parametrize(("after"), [(1, 0, 8), (4, 1, 4), (2, 3, 16)])
def test_a_resume_on_another_layout_trains_each_remaining_sample_once(after):
    taken, rest, _ = taken_then_rest((2, 2, 8), after, k=3)
    assert len(taken) == 2 * 3 * 8
    assert sorted(taken + [i for ids_ in rest for i in ids_]) == list(range(96))


def test_a_checkpoint_of_a_longer_stream_is_one_line():
    loader = batches_of(Numbers([16, 16]))
    with pytest.raises(ConfigError) as error:
        loader.load_stream_state({"epoch": 1, "remaining": [[8, 16], [40, 48]]})
    assert str(error.value) == (
        "resume: the checkpoint's stream position reaches sample 48 of epoch 1, but Numbers "
        "now holds 32 samples; resume with the data it trained on, or start afresh (resume=null)"
    )


def test_the_shuffle_buffer_is_blocks_so_a_seek_rereads_at_most_one():
    stream = Numbers([50, 30])
    order = EpochOrder(stream.piece_lengths(), epoch=2, seed=1, shuffle=True, block=8)
    whole = [s["id"] for s in order.samples(stream, 0, 80)]
    assert sorted(whole) == list(range(80)) and whole != list(range(80))
    for start in (0, 13, 47, 71):
        stream.reads = 0
        assert [s["id"] for s in order.samples(stream, start, start + 5)] == whole[start : start + 5]  # fmt: skip
        # what it hands out, and the rest of the blocks it starts and ends in: not the past
        assert stream.reads <= 5 + 2 * (8 - 1)


def first_batch_seconds(loader, remaining: list[list[int]]) -> float:
    loader.load_stream_state({"epoch": 0, "remaining": remaining})
    best = float("inf")
    for _ in range(3):
        loader.set_epoch(0, start=100_000 - remaining[0][1] + remaining[0][0])
        begin = time.perf_counter()
        next(iter(loader))
        best = min(best, time.perf_counter() - begin)
    return best


def test_resuming_at_90_percent_of_a_long_stream_is_as_quick_as_at_its_start():
    stream = Numbers([1000] * 100, cost=20)  # 100,000 samples
    loader = batches_of(stream, batch=32)
    at_start = first_batch_seconds(loader, [[0, 100_000]])
    stream.reads = 0
    at_90 = first_batch_seconds(loader, [[90_000, 100_000]])
    assert stream.reads <= 3 * (8 + 32)  # three first batches: whole blocks, none before
    # ms-scale timings on a busy machine vary 2-3x; reading the 90,000 samples before the
    # resume point would take some thousand times as long, so 10x still catches it
    assert at_90 <= 10 * at_start, (at_90, at_start)


def test_a_plain_iterable_dataset_trains_and_one_without_length_needs_max_steps(tmp_path):
    common = (
        "model=mlp", "data.image_size=4", f"data._target_={__name__}.source",
        "data.on_device=false", "batch_size=8", "data.num_samples=96", "data.num_val_samples=16",
    )  # fmt: skip
    summary = fit(make_cfg(*common, "+data.kind=sized", "epochs=1"), tmp_path / "sized").summary
    assert summary["steps"] == 12 and summary["val_loss"] is not None
    with pytest.raises(ConfigError) as error:
        fit(make_cfg(*common, "+data.kind=unsized", "epochs=1"), tmp_path / "unsized")
    assert str(error.value) == (
        "max_steps=None is not allowed; the training stream Unsized has no length (no "
        "__len__), so no epoch ends: set max_steps=N"
    )
    endless = make_cfg(*common, "+data.kind=unsized", "max_steps=15", "dataloader.num_workers=2")
    summary = fit(endless, tmp_path / "endless").summary  # past the 96 samples' 12 batches
    assert summary["steps"] == 15 and summary["samples"] == 15 * 8


def model_of(folder):
    return load_checkpoint(latest_checkpoint(folder / "checkpoints"))


def test_sigterm_mid_epoch_then_resume_matches_an_uninterrupted_run(tmp_path, kind="stream"):
    gears = (
        "model=mlp", "data.image_size=4", f"data._target_={__name__}.source", f"+data.kind={kind}",
        "data.on_device=false", "batch_size=8", "accum=2", "epochs=2", "data.num_samples=96",
        "data.num_val_samples=16", "dataloader.num_workers=2", "checkpoint.every_n_steps=100",
    )  # fmt: skip
    fit(make_cfg(*gears), tmp_path / "whole")
    with SignalAtStep(4, signal.SIGTERM), pytest.raises(TrainingStopped):
        fit(make_cfg(*gears), tmp_path / "stopped")
    stopped = model_of(tmp_path / "stopped")["position"]
    assert stopped["step"] == 4 and stopped["epoch"] == 0  # mid-epoch: 6 steps an epoch
    assert stopped["stream"]["remaining"] != [[0, 96]]
    fit(make_cfg(*gears), tmp_path / "stopped")
    final, reference = model_of(tmp_path / "stopped"), model_of(tmp_path / "whole")
    assert final["position"] == reference["position"] and final["position"]["step"] == 12
    for name, tensor in reference["model"].items():
        assert torch.equal(final["model"][name], tensor), name


def test_a_stream_trains_through_the_cli_as_2_rank_ddp_with_tuned_loading(tmp_path, monkeypatch):
    here = str(Path(__file__).parent)  # the ranks import this module's source
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    )
    done = run_train(
        "logger=none", "progress_bar=false", "model=mlp", "data.image_size=4",
        f"data._target_={__name__}.source", "data.on_device=false", "batch_size=8",
        "data.num_samples=96", "data.num_val_samples=16", "dataloader=tuned", "accum=2",
        "distributed.nproc_per_node=2", "device=cpu", "max_steps=4",
        cwd=tmp_path, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = next(tmp_path.glob("runs/*/summary.json")).read_text()
    assert '"world_size": 2' in summary and '"steps": 4' in summary


def test_batch_size_auto_sizes_a_stream(tmp_path):
    cfg = make_cfg(
        "model=mlp", "data.image_size=4", f"data._target_={__name__}.source",
        "data.on_device=false", "batch_size=auto", "batch_size_finder.max_memory_gib=0.05",
        "data.num_samples=96", "data.num_val_samples=16", "max_steps=2",
    )  # fmt: skip
    summary = fit(cfg, tmp_path).summary
    size = summary["gears"]["batch_size"]
    assert summary["batch_size_finder"]["batch_size"] == size and 8 <= size <= 96


class Bytes(Numbers):
    """uint8 images: the host copies bytes, the device scales them."""

    def read(self, piece: int, offset: int):
        for sample in super().read(piece, offset):
            yield sample | {"x": sample["x"].to(torch.uint8)}


def byte_source(num_samples: int = 96, num_val_samples: int = 32, **_):
    return Bytes([num_samples // 4] * 4), Bytes([num_val_samples])


@pytest.mark.gpu
def test_a_dict_stream_on_cuda_is_pinned_prefetched_and_channels_last(tmp_path, monkeypatch):
    from gearshift.build import Parts

    seen = []
    place = Parts.place

    def recording(parts, batch, train=False):
        seen.append(batch["x"])  # as the prefetcher hands it over: already on the device
        return place(parts, batch, train)

    monkeypatch.setattr(Parts, "place", recording)
    cfg = make_cfg(
        "device=cuda", "model=simple_cnn", "data.image_size=4", f"data._target_={__name__}.byte_source",
        "data.on_device=false", "dataloader=tuned", "dataloader.num_workers=2",
        "dataloader.pin_memory=true", "dataloader.prefetch_to_device=true",
        "memory_format=channels_last", "batch_size=8", "accum=2", "max_steps=4",
    )  # fmt: skip
    summary = fit(cfg, tmp_path).summary
    assert summary["gears"]["prefetch_to_device"] is True and summary["gears"]["pin_memory"]
    assert summary["steps"] == 4
    x = seen[0]
    assert x.is_cuda and x.dtype == torch.uint8  # bytes crossed; the device scales them
    assert x.is_contiguous(memory_format=torch.channels_last)
