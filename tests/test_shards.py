"""Tar shards in the WebDataset layout: scripts/make_shards.py writes them, data=shards reads
them (decoded like data=imagefolder), resumes exactly, and names a damaged shard's member."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
import textwrap
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import ROOT, load_script, make_cfg, run_train, stops_at_damaged_file, train_in_process
from test_checkpoint import assert_a_stream_or_index_source_resumes_exactly
from test_datasets import CPU, run_dir
from test_images_uint8 import write_photos

from gearshift.config import ConfigError, check_config
from gearshift.data.decode import ImageDecoder
from gearshift.data.shards import INDEX, ShardSamples, read_members
from gearshift.data_batches import data_batches
from gearshift.state.checkpoint_reads import load_checkpoint

_script = load_script("make_shards")
make_shards, make_shards_main = _script.make_shards, _script.main


def shards_cfg(path: Path, *overrides: str):
    return make_cfg(
        "data=shards", f"data.path={path}", "data.num_classes=3", "data.image_size=16",
        "data.num_samples=null", "data.num_val_samples=null", "batch_size=8", *overrides,
    )  # fmt: skip


def test_make_shards_writes_the_webdataset_layout_and_an_index_that_seeks(tmp_path):
    write_photos(tmp_path / "images", per_class=8)  # 24 JPEGs of 40x52, 3 classes
    written = make_shards(tmp_path / "images", tmp_path / "shards", shard_mb=0.006)
    assert {k: v["samples"] for k, v in written.items()} == {"train": 21, "val": 3}
    assert written["train"]["shards"] > 3  # about 1.7 KB a JPEG, 6 KB shards
    sources = {p.read_bytes(): int(p.parent.name[1]) for p in (tmp_path / "images").rglob("*.jpg")}
    seen = []
    for split in ("train", "val"):
        folder = tmp_path / "shards" / split
        index = json.loads((folder / INDEX).read_text())
        assert index["classes"] == ["c0", "c1", "c2"]
        tars = sorted(folder.glob("*.tar"))
        assert len(tars) == written[split]["shards"]
        assert [t.name for t in tars] == [s["file"] for s in index["shards"]]
        assert tars[0].name == "000000.tar"
        for tar_path, entry in zip(tars, index["shards"], strict=True):
            assert tar_path.stat().st_size <= 0.006 * 2**20 + 10240  # the limit + tar's end blocks
            with tarfile.open(tar_path) as tar:
                members = tar.getmembers()
                names = [m.name for m in members]
                assert names[0::2] == entry["members"] and entry["samples"] == len(names) // 2
                for m_jpg, m_cls, offset in zip(
                    members[0::2], members[1::2], entry["offsets"], strict=True
                ):
                    key = m_jpg.name.split(".")[0]
                    assert m_jpg.name == f"{key}.jpg" and m_cls.name == f"{key}.cls"
                    assert m_jpg.offset_data == offset
                    data = tar.extractfile(m_jpg).read()
                    label = int(tar.extractfile(m_cls).read())
                    assert sources[data] == label  # the file's bytes, with its class
                    seen.append(data)
        # the index alone finds every image: a seek and a read per sample
        samples = ShardSamples(folder, index)
        for shard in range(len(tars)):
            for i, data in read_members(samples, shard, member=1):
                assert data in sources and samples.shard[i] == shard
    assert sorted(seen) == sorted(sources)  # each image once, in one split
    shard_classes = {
        int(label)
        for label in json.loads((tmp_path / "shards/train" / INDEX).read_text())["shards"][0][
            "labels"
        ]
    }
    assert len(shard_classes) > 1  # shuffled before sharding: shards mix classes


def test_resized_shards_hold_the_centre_square_at_the_staged_size(tmp_path):
    write_photos(tmp_path / "images", per_class=2, size=(60, 80))
    make_shards(tmp_path / "images", tmp_path / "shards", resize=16, val_fraction=0)
    samples = ShardSamples(
        tmp_path / "shards/train", json.loads((tmp_path / "shards/train" / INDEX).read_text())
    )
    sides = {
        ImageDecoder("pil", 3, 18).decode("x", data).shape for _, data in read_members(samples, 0)
    }
    assert sides == {(3, 18, 18)}  # round(1.15 * 16)
    assert not (tmp_path / "shards/val").exists()  # no validation split asked for


def test_make_shards_bad_input_is_one_line_and_leaves_nothing(tmp_path, capsys):
    assert make_shards_main([str(tmp_path / "nothing"), str(tmp_path / "out")]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"error: SRC='{tmp_path / 'nothing'}' is not allowed; no such folder"
    )
    write_photos(tmp_path / "images", per_class=2)
    whole = (tmp_path / "images/c1/0.jpg").read_bytes()
    (tmp_path / "images/c1/0.jpg").write_bytes(whole[: len(whole) // 2])
    assert make_shards_main([str(tmp_path / "images"), str(tmp_path / "out"), "--resize", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot decode image {tmp_path / 'images/c1/0.jpg'}" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]  # no OUT, no temporary


def test_shards_train_from_the_command_line(tmp_path):
    write_photos(tmp_path / "images", per_class=4)
    make_shards(tmp_path / "images", tmp_path / "shards", shard_mb=0.004)
    (tmp_path / "work").mkdir()
    result = run_train(
        "data=shards", f"data.path={tmp_path / 'shards'}", "data.num_classes=3",
        "data.image_size=16", "model=simple_cnn", "batch_size=4", "max_steps=3",
        "dataloader.num_workers=2", "logger=none", "progress_bar=false", cwd=tmp_path / "work",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(next((tmp_path / "work").rglob("summary.json")).read_text())
    assert summary["steps"] == 3 and summary["gears"]["decoder"]


def test_every_sample_once_per_epoch_in_the_index_order(tmp_path):
    write_photos(tmp_path / "images", per_class=4)
    make_shards(tmp_path / "images", tmp_path / "shards", shard_mb=0.004, val_fraction=0)
    train, _ = data_batches(shards_cfg(tmp_path / "shards", "batch_size=5"), CPU)
    labels = torch.cat([targets for _, targets in train])
    index = json.loads((tmp_path / "shards/train" / INDEX).read_text())
    assert sorted(labels.tolist()) == sorted(x for s in index["shards"] for x in s["labels"])


@pytest.mark.parametrize("streaming", [False, True], ids=["by-index", "streaming"])
def test_stop_mid_epoch_then_resume_equals_an_uninterrupted_run(tmp_path, streaming):
    write_photos(tmp_path / "images", per_class=8)  # 21 to train: 3 batches an epoch
    make_shards(tmp_path / "images", tmp_path / "shards", shard_mb=0.006)
    source = partial(shards_cfg, tmp_path / "shards")
    assert_a_stream_or_index_source_resumes_exactly(source, tmp_path, streaming)


@pytest.mark.parametrize("streaming", [False, True], ids=["by-index", "streaming"])
def test_a_damaged_member_met_mid_epoch_is_named_by_shard_and_member(tmp_path, streaming):
    write_photos(tmp_path / "images", per_class=8)
    whole = (tmp_path / "images/c2/0.jpg").read_bytes()
    (tmp_path / "images/c2/zz.jpg").write_bytes(whole[: len(whole) // 2])  # stored as it is
    make_shards(tmp_path / "images", tmp_path / "shards", shard_mb=0.006, val_fraction=0)
    index = json.loads((tmp_path / "shards/train" / INDEX).read_text())
    damaged = next(
        f"{tmp_path / 'shards/train' / s['file']}:{m}"
        for s in index["shards"]
        for m, size in zip(s["members"], s["sizes"], strict=True)
        if size == len(whole) // 2
    )
    cfg = shards_cfg(
        tmp_path / "shards", "model=simple_cnn", "accum=2", "epochs=1", "data.decoder=pil",
        f"data.streaming={streaming}",
    )  # fmt: skip
    checkpoint = stops_at_damaged_file(cfg, run_dir(tmp_path), damaged)
    assert load_checkpoint(checkpoint)["position"]["epoch_samples"] % 16 == 0  # an optimizer step


@pytest.mark.parametrize("problem", ["empty", "truncated", "no-shards", "classes"])
def test_bad_shard_folders_stop_at_start_with_one_line(tmp_path, problem):
    write_photos(tmp_path / "images", per_class=4)
    make_shards(tmp_path / "images", tmp_path / "shards", shard_mb=0.004, val_fraction=0)
    folder = tmp_path / "shards/train"
    index = json.loads((folder / INDEX).read_text())
    classes = 3
    if problem == "empty":
        (folder / INDEX).write_text(json.dumps({**index, "shards": []}))
        expected = f"{folder / INDEX} lists no shards (an empty shard list)"
    elif problem == "truncated":
        last = folder / index["shards"][-1]["file"]
        last.write_bytes(last.read_bytes()[:700])
        expected = f"shard {last} holds 700 bytes, its index says at least"
    elif problem == "no-shards":  # no index.json and no tars (tars alone: test_foreign_shards)
        for file in folder.iterdir():
            file.unlink()
        expected = f"{folder} holds no shards (.tar files)"
    else:
        classes = 5
        expected = None
    cfg = shards_cfg(tmp_path / "shards", f"data.num_classes={classes}")
    check_config(cfg)
    with pytest.raises(ConfigError) as error:
        data_batches(cfg, CPU)
    if expected is None:
        assert str(error.value) == (
            f"data.num_classes=5 is not allowed; the shards in {folder} have 3 classes "
            "(c0, c1, c2); set data.num_classes=3"
        )
    else:
        assert str(error.value).startswith(f"data.path='{tmp_path / 'shards'}' is not allowed; ")
        assert expected in str(error.value), str(error.value)
        assert "\n" not in str(error.value)
    assert re.match(r"data\.(path|num_classes)=", str(error.value))


def test_a_shard_cut_in_half_is_one_line_naming_its_first_lost_member_and_exit_2(tmp_path):
    write_photos(tmp_path / "images", per_class=8)
    make_shards(tmp_path / "images", tmp_path / "shards", shard_mb=0.006, val_fraction=0)
    folder = tmp_path / "shards/train"
    shard = json.loads((folder / INDEX).read_text())["shards"][1]
    tar = folder / shard["file"]
    half = tar.stat().st_size // 2
    tar.write_bytes(tar.read_bytes()[:half])
    ends = [o + s for o, s in zip(shard["offsets"], shard["sizes"], strict=True)]
    lost = next(n for n, end in enumerate(ends) if end > half)  # the first member past the cut
    (tmp_path / "work").mkdir()
    result = train_in_process(
        "data=shards", f"data.path={tmp_path / 'shards'}", "data.num_classes=3",
        "data.image_size=16", "model=simple_cnn", "batch_size=4", "max_steps=3", "logger=none",
        "progress_bar=false", cwd=tmp_path / "work",
    )  # fmt: skip
    assert result.returncode == 2
    assert [line for line in result.stderr.splitlines() if line] == [
        f"error: data.path='{tmp_path / 'shards'}' is not allowed; shard {tar} holds {half} "
        f"bytes, its index says at least {max(ends)}: member {shard['members'][lost]} ends at "
        f"byte {ends[lost]}, past the end; the shard is truncated; write it again"
    ]
    assert list((tmp_path / "work").iterdir()) == []  # no run folder


def test_the_stream_reads_any_shard_from_any_member_on_in_file_order(tmp_path, monkeypatch):
    """The piece reader of the stream protocol: shard k from member m on is a seek there,
    then the members in file order (no pass over the ones before)."""
    from gearshift.data import shards as module

    write_photos(tmp_path / "images", per_class=8)
    make_shards(tmp_path / "images", tmp_path / "shards", shard_mb=0.006, val_fraction=0)
    cfg = shards_cfg(tmp_path / "shards", "data.decoder=pil", "data.num_samples=17")
    images = data_batches(cfg, CPU)[0].loader.dataset  # a seeded subset of 17 of the 21
    stream = module.ShardStream(images)
    lengths = stream.piece_lengths()
    assert sum(lengths) == 17 == len(stream) and len(lengths) == len(images.samples.files)
    read_bytes = []

    class Counted:  # the shard file, counting the bytes read from it
        def __init__(self, path, mode):
            self.handle = open(path, mode)  # noqa: SIM115

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def seek(self, at):
            self.handle.seek(at)

        def read(self, size):
            read_bytes.append(size)
            return self.handle.read(size)

    monkeypatch.setattr(module, "open", Counted, raising=False)
    sizes = images.samples.sizes
    by_index = [images[i] for i in range(17)]
    first = 0
    for piece, length in enumerate(lengths):
        for offset in range(length):
            read_bytes.clear()
            got = list(stream.read(piece, offset))
            assert len(got) == length - offset
            # only the members from `offset` on are read: a seek, not a pass over the shard
            assert sum(read_bytes) == sum(sizes[first + offset : first + length])
            for (image, label), (want_image, want_label) in zip(
                got, by_index[first + offset : first + length], strict=True
            ):
                assert label == want_label and torch.equal(image, want_image)
        first += length
    assert [torch.equal(a[0], b[0]) for a, b in zip(stream, by_index, strict=True)] == [True] * 17


def test_a_reader_collected_at_exit_or_after_a_failed_init_goes_quietly(tmp_path):
    """ShardReader.__del__ with its module's globals already torn down (interpreter exit)
    and on a reader whose __init__ failed before it set its file descriptors."""
    (tmp_path / "000000.tar").write_bytes(b"\0" * 512)
    script = textwrap.dedent(f"""
        import gc, os, types
        from gearshift.data.shards import ShardReader

        class Failing(ShardReader):
            def __init__(self, samples):
                raise ValueError("before any attribute")

        try:
            Failing(None)
        except ValueError:
            pass
        gc.collect()
        reader = ShardReader(None)
        reader.fds[0] = os.open({str(tmp_path / "000000.tar")!r}, os.O_RDONLY)
        types.reader = reader  # types is imported before shards: torn down after it, at exit
    """)
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_bench_data_times_indexing_and_has_the_shard_rows(tmp_path, monkeypatch):
    # the rest of bench_data's rows, each loader's batches: tests/test_images_uint8.py
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import bench_data

    monkeypatch.setenv("GEARSHIFT_CACHE", str(tmp_path / "cache"))
    cold, cached = bench_data.index_build_time(tmp_path, members=200)  # asserts the count
    assert cold > 0 and cached > 0
    args = SimpleNamespace(classes=3, size=32, batch=4, workers=0)
    rows = bench_data.configurations(tmp_path / "images", tmp_path / "stage", args, CPU)
    assert "uint8, shards (source JPEGs), no index.json" in rows
    assert "uint8, shards --resize (37 px JPEGs)" in rows


def test_a_bad_streaming_value_of_data_shards_is_one_line_before_any_run_folder(tmp_path):
    # as tests/test_typed_nodes.py checks every other source's, model's and task's keys
    done = train_in_process("data=shards", "data.streaming=1", "max_steps=1", cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.splitlines() == [
        "error: data.streaming=1 is not allowed; choose true or false"
    ]
    assert list(tmp_path.iterdir()) == []
