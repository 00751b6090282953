"""Shard sets written by other tools (webdataset's layout, the tars written here with
`tarfile`): data=shards reads them as they are, without index.json (the index built from the
tar headers and cached outside the data folder), from a brace list, and resumes exactly."""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import tarfile
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from helpers import load_script, make_cfg, run_train
from PIL import Image
from test_checkpoint import assert_a_stream_or_index_source_resumes_exactly
from test_datasets import CPU
from test_images_uint8 import photo

from gearshift.config import ConfigError, check_config
from gearshift.data import tar_index
from gearshift.data.shards import INDEX
from gearshift.data.tar_index import expand_braces
from gearshift.data_batches import data_batches

make_shards_main = load_script("make_shards").main
CLASSES = ["red", "green", "blue"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    """The header indexes go under the test's folder, not the user's cache."""
    monkeypatch.setenv("GEARSHIFT_CACHE", str(tmp_path / "cache"))


def jpeg(k: int, i: int) -> bytes:
    pixels = photo(20, 26, seed=10 * k + i)
    pixels[..., k] = np.maximum(pixels[..., k], 160)  # the class shows in one channel
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_foreign(folder: Path, layout: str, samples: int = 21, per_tar: int = 6, name="{:06d}"):
    """`samples` as webdataset's writers lay them out: `<key>.jpg` + `<key>.cls` (decimal),
    `.json` ({"label": n, ...}) or `.txt` (the class name); [(member, label)] in order."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for first in range(0, samples, per_tar):
        with tarfile.open(folder / f"{name.format(first // per_tar)}.tar", "w") as tar:
            for n in range(first, min(first + per_tar, samples)):
                k, key = n % 3, f"s{n:05d}"
                _add(tar, f"{key}.jpg", jpeg(k, n))
                label = {
                    "cls": str(k),
                    "json": json.dumps({"caption": "x", "label": k}),
                    "txt": CLASSES[k],
                }[layout]
                _add(tar, f"{key}.{layout}", label.encode())
                written.append((f"{key}.jpg", CLASSES.index(CLASSES[k])))
    return written


def foreign_cfg(path, *overrides: str):
    return make_cfg(
        "data=shards", f"data.path='{path}'", "data.num_classes=3", "data.image_size=16",
        "data.num_samples=null", "data.num_val_samples=null", "batch_size=8", *overrides,
    )  # fmt: skip


def test_brace_lists_expand_as_bash_does():
    assert expand_braces("/d/train-{000..003}.tar") == [f"/d/train-00{n}.tar" for n in range(4)]
    assert expand_braces("/d/{a,b}-{8..10}.tar") == [
        "/d/a-8.tar", "/d/a-9.tar", "/d/a-10.tar", "/d/b-8.tar", "/d/b-9.tar", "/d/b-10.tar",
    ]  # fmt: skip
    assert expand_braces("/d/x{y}.tar") == ["/d/x{y}.tar"] and expand_braces("/d/0.tar") == [
        "/d/0.tar"
    ]


@pytest.mark.parametrize("layout", ["cls", "json", "txt"])
def test_the_header_index_finds_every_image_and_label_and_is_cached_outside(
    tmp_path, layout, monkeypatch
):
    written = write_foreign(tmp_path / "wds", layout)
    os.chmod(tmp_path / "wds", 0o555)  # a read-only data folder: nothing is written there
    try:
        cfg = foreign_cfg(tmp_path / "wds", "data.decoder=pil")
        check_config(cfg)
        train, val = data_batches(cfg, CPU)
        samples = train.loader.dataset.samples
        assert val is None and len(samples) == 21 and len(samples.files) == 4
        assert samples.members == [m for m, _ in written]
        labels = [label for _, label in written]
        if layout == "txt":  # class names: sorted, as data=imagefolder orders its folders
            labels = [sorted(CLASSES).index(CLASSES[x]) for x in labels]
        assert samples.labels.tolist() == labels
        assert samples.classes == (sorted(CLASSES) if layout == "txt" else ["0", "1", "2"])
        # each image's bytes are where the index says: the JPEG the tar holds
        with tarfile.open(samples.files[1]) as tar:
            first = tar.extractfile(samples.members[6]).read()
        assert train.loader.dataset.reader.read(6) == first
        assert sorted(os.listdir(tmp_path / "wds")) == [f"{n:06d}.tar" for n in range(4)]
        assert len(list((tmp_path / "cache/tar-index").glob("*.json"))) == 4
        # a second start reads the cache, not the tars; a changed tar is indexed again
        scanned = []
        real = tar_index.scan_tar
        monkeypatch.setattr(tar_index, "scan_tar", lambda p, *a: scanned.append(p) or real(p, *a))
        data_batches(cfg, CPU)
        assert scanned == []
        os.utime(tmp_path / "wds/000002.tar", ns=(1, 1))
        data_batches(cfg, CPU)
        assert scanned == [tmp_path / "wds/000002.tar"]
    finally:
        os.chmod(tmp_path / "wds", 0o755)


@pytest.mark.parametrize(
    ("layout", "where", "streaming"),
    [
        ("cls", "folder", False),
        ("json", "folder", True),
        ("cls", "brace", True),
        ("json", "indexed", False),
    ],
    ids=["cls-no-index", "json-no-index-streaming", "cls-brace-list-streaming", "json-index.json"],
)
def test_shards_of_another_tool_train_and_resume_exactly(tmp_path, layout, where, streaming):
    write_foreign(tmp_path / "wds", layout, name="train-{:06d}")
    path = tmp_path / "wds"
    if where == "brace":
        path = tmp_path / "wds/train-{000000..000003}.tar"
    if where == "indexed":  # make_shards.py --index: index.json beside the tars
        assert make_shards_main([str(tmp_path / "wds"), "--index"]) == 0
        index = json.loads((tmp_path / "wds" / INDEX).read_text())
        assert index["classes"] == ["0", "1", "2"] and len(index["shards"]) == 4
        shutil.rmtree(tmp_path / "cache")  # what --index cached: training must not need it
    source = partial(foreign_cfg, path, "data.decoder=pil")
    assert_a_stream_or_index_source_resumes_exactly(source, tmp_path, streaming)
    if where == "indexed":
        assert not (tmp_path / "cache").exists()  # index.json read: no header index built


def test_another_tools_shards_train_from_the_command_line_as_the_readme_shows(tmp_path):
    write_foreign(tmp_path / "wds", "cls", name="train-{:06d}")
    (tmp_path / "work").mkdir()
    result = run_train(
        "data=shards", f"data.path='{tmp_path}/wds/train-{{000000..000003}}.tar'",
        "data.num_classes=3", "data.image_size=16", "model=simple_cnn", "batch_size=4",
        "max_steps=3", "logger=none", "progress_bar=false", cwd=tmp_path / "work",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(next((tmp_path / "work").rglob("summary.json")).read_text())
    assert summary["steps"] == 3


@pytest.mark.parametrize(
    "problem", ["no-label", "label-key", "names", "gzip", "missing", "classes", "empty"]
)
def test_bad_shard_sets_of_other_tools_stop_at_start_with_one_line(tmp_path, problem):
    write_foreign(tmp_path / "wds", "json", samples=6)
    path, overrides = f"{tmp_path / 'wds'}", []
    tar = tmp_path / "wds/000000.tar"
    if problem == "no-label":
        with tarfile.open(tar, "a") as handle:
            _add(handle, "s99999.jpg", jpeg(0, 0))
        expected = (
            f"data.label_key='auto' is not allowed; sample {tar}:s99999 holds jpg: no cls or txt "
            "or json member; set data.label_key to the extension that holds the label"
        )
    elif problem == "label-key":
        overrides = ["data.label_key=json.class"]
        expected = (
            f"data.label_key='json.class' is not allowed; {tar}:s00000.json holds no label "
            "(no 'class' field)"
        )
    elif problem == "names":  # every caption is "x": one class name
        overrides = ["data.label_key=json.caption"]
        expected = (
            f"data.num_classes=3 is not allowed; the shards in {tmp_path / 'wds'} have 1 "
            "classes (x); set data.num_classes=1"
        )
    elif problem == "gzip":
        import gzip

        tar.write_bytes(gzip.compress(tar.read_bytes()))
        expected = f"data.path='{path}' is not allowed; shard {tar} is compressed (gzip)"
    elif problem == "missing":
        path = f"{tmp_path}/wds/{{000000..000004}}.tar"
        expected = (
            f"data.path='{path}' is not allowed; 4 of the 5 shards it names do not exist "
            f"(the first: {tmp_path / 'wds/000001.tar'})"
        )
    elif problem == "classes":
        overrides = ["data.num_classes=2"]
        expected = (
            f"data.num_classes=2 is not allowed; the shards in {tmp_path / 'wds'} hold labels "
            "0..2, expected 0..1; set data.num_classes=3"
        )
    else:
        for file in (tmp_path / "wds").iterdir():
            file.unlink()
        expected = f"data.path='{path}' is not allowed; {tmp_path / 'wds'} holds no shards"
    cfg = foreign_cfg(path, *overrides)
    check_config(cfg)
    with pytest.raises(ConfigError) as error:
        data_batches(cfg, CPU)
    assert expected in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_a_damaged_member_of_another_tools_shard_is_named_by_shard_and_member(tmp_path):
    write_foreign(tmp_path / "wds", "cls", samples=6)
    tar = tmp_path / "wds/000000.tar"
    with tarfile.open(tar) as handle:
        member = handle.getmember("s00003.jpg")
    data = bytearray(tar.read_bytes())
    data[member.offset_data : member.offset_data + member.size] = b"\0" * member.size
    tar.write_bytes(bytes(data))
    train, _ = data_batches(foreign_cfg(tmp_path / "wds", "data.decoder=pil"), CPU)
    with pytest.raises(Exception) as error:
        train.loader.dataset[3]
    assert str(error.value) == (
        f"cannot decode image {tar}:s00003.jpg: not an image file PIL can identify "
        f"({member.size} bytes, starting 00000000)"
    )


def test_the_shard_list_is_checked_at_start(tmp_path):
    with pytest.raises(ConfigError, match=r"no such folder; expected a shard folder, one \.tar"):
        check_config(foreign_cfg(f"{tmp_path}/nothing"))
    write_foreign(tmp_path / "wds", "cls", samples=3)
    with pytest.raises(ConfigError, match=r"data\.label_key=.cls json. is not allowed; expected"):
        check_config(foreign_cfg(tmp_path / "wds", "data.label_key='cls json'"))
    with pytest.raises(ConfigError, match=r"data\.stage_to=.* it stages a shard folder"):
        check_config(
            foreign_cfg(f"{tmp_path}/wds/{{000000..000000}}.tar", f"data.stage_to={tmp_path}/s")
        )


def cut_or_overwrite(tar: Path, damage: str) -> str:
    """Damage the tar as a partial copy (or a bad write) does; the end of the line naming it."""
    with tarfile.open(tar) as handle:
        image, before = handle.getmember("s00009.jpg"), handle.getmember("s00008.cls")
    data = tar.read_bytes()
    if damage == "in-member":  # cut inside an image's bytes
        tar.write_bytes(data[: image.offset_data + 10])
        return (
            f"is truncated: it holds {image.offset_data + 10} bytes, member s00009.jpg ends at "
            f"byte {image.offset_data + image.size}; copy or write it again"
        )
    if damage == "in-header":  # cut inside the header after a member: tarfile stops there
        tar.write_bytes(data[: image.offset + 100])
        return (
            f"is truncated: it holds {image.offset + 100} bytes and ends after member "
            f"s00008.cls (byte {image.offset}), where a header or the end-of-archive blocks "
            "belong; copy or write it again"
        )
    junk = data[: image.offset] + b"x" * 512 + data[image.offset + 512 :]
    tar.write_bytes(junk)  # a header that does not parse: tarfile stops there too
    assert before.offset < image.offset
    return (
        f"does not parse: the header at byte {image.offset}, after member s00008.cls, is not "
        "a tar header; write it again"
    )


@pytest.mark.parametrize("damage", ["in-member", "in-header", "header"])
def test_a_tar_cut_short_or_overwritten_stops_at_start_naming_the_member_and_byte(tmp_path, damage):
    write_foreign(tmp_path / "wds", "cls")  # 000001.tar holds s00006..s00011
    tar = tmp_path / "wds/000001.tar"
    ending = cut_or_overwrite(tar, damage)
    cfg = foreign_cfg(tmp_path / "wds")
    check_config(cfg)
    with pytest.raises(ConfigError) as error:
        data_batches(cfg, CPU)
    assert str(error.value) == (
        f"data.path='{tmp_path / 'wds'}' is not allowed; shard {tar} {ending}"
    ), str(error.value)


def test_a_cached_index_does_not_hide_a_tar_cut_short_since(tmp_path):
    write_foreign(tmp_path / "wds", "cls")
    cfg = foreign_cfg(tmp_path / "wds", "data.decoder=pil")
    train, _ = data_batches(cfg, CPU)
    assert len(train.loader.dataset) == 21  # every tar indexed and cached
    tar = tmp_path / "wds/000001.tar"
    status = tar.stat()
    tar.write_bytes(tar.read_bytes()[: status.st_size // 2])  # a partial copy over it
    os.utime(tar, ns=(status.st_atime_ns, status.st_mtime_ns))  # with the old mtime kept
    with pytest.raises(ConfigError, match=rf"shard {tar} is truncated: it holds 10240 bytes"):
        data_batches(cfg, CPU)


@pytest.mark.parametrize("launcher", ["plain", "nproc_per_node"])
def test_a_tar_cut_in_half_stops_the_run_with_one_line_and_exit_2(tmp_path, launcher):
    write_foreign(tmp_path / "wds", "cls")
    tar = tmp_path / "wds/000001.tar"
    tar.write_bytes(tar.read_bytes()[: tar.stat().st_size // 2])
    (tmp_path / "work").mkdir()
    ranks = ["distributed.nproc_per_node=2"] if launcher == "nproc_per_node" else []
    result = run_train(
        "data=shards", f"data.path={tmp_path / 'wds'}", "data.num_classes=3",
        "data.image_size=16", "model=simple_cnn", "batch_size=4", "max_steps=3", *ranks,
        "device=cpu", "logger=none", "progress_bar=false",
        cwd=tmp_path / "work", env={"GEARSHIFT_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip() == (
        f"error: data.path='{tmp_path / 'wds'}' is not allowed; shard {tar} is truncated: it "
        "holds 10240 bytes and ends after member s00009.cls (byte 10240), where a header or the "
        "end-of-archive blocks belong; copy or write it again"
    )
    assert list((tmp_path / "work").iterdir()) == []  # no run folder


def write_named(folder: Path, splits: dict[str, int]) -> None:
    """`<split>-000000.tar`, ... in one folder: `splits` samples each, 5 to a tar."""
    for split, samples in splits.items():
        write_foreign(folder, "cls", samples=samples, per_tar=5, name=split + "-{:06d}")


def test_a_folder_of_train_and_val_shards_splits_by_their_names(tmp_path, caplog):
    write_named(tmp_path / "wds", {"train": 20, "val": 5, "test": 10})
    with caplog.at_level(logging.INFO, logger="gearshift"):
        train, val = data_batches(foreign_cfg(tmp_path / "wds", "data.decoder=pil"), CPU)
    train_files, val_files = train.loader.dataset.samples.files, val.loader.dataset.samples.files
    assert len(train.loader.dataset) == 20 and len(val.loader.dataset) == 5
    assert [Path(f).name for f in train_files] == [f"train-{n:06d}.tar" for n in range(4)]
    assert [Path(f).name for f in val_files] == ["val-000000.tar"]
    logged = [r.getMessage() for r in caplog.records]
    assert (
        f"data: 20 training and 5 validation samples in 4 + 1 shards from {tmp_path / 'wds'}"
        in logged
    )
    assert (
        f"data: 2 test shards in {tmp_path / 'wds'} left out (neither trained on nor validated)"
        in logged
    )
    # make_shards.py --index would put them in one index.json, one split: refused
    assert make_shards_main([str(tmp_path / "wds"), "--index"]) == 2
    assert not (tmp_path / "wds" / INDEX).exists()


def test_unnamed_shards_all_train_and_data_val_path_names_the_validation_shards(tmp_path):
    write_foreign(tmp_path / "wds", "cls", samples=12)  # 000000.tar, 000001.tar
    write_named(tmp_path / "held", {"val": 10})
    train, val = data_batches(foreign_cfg(tmp_path / "wds", "data.decoder=pil"), CPU)
    assert len(train.loader.dataset) == 12 and val is None  # as before: no validation
    val_path = f"{tmp_path}/held/val-{{000000..000001}}.tar"
    cfg = foreign_cfg(tmp_path / "wds", "data.decoder=pil", f"data.val_path='{val_path}'")
    check_config(cfg)
    train, val = data_batches(cfg, CPU)
    assert len(train.loader.dataset) == 12 and len(val.loader.dataset) == 10
    # a brace list for each split
    cfg = foreign_cfg(f"{tmp_path}/wds/{{000000..000000}}.tar", f"data.val_path='{val_path}'")
    train, val = data_batches(cfg, CPU)
    assert len(train.loader.dataset) == 6 and len(val.loader.dataset) == 10


@pytest.mark.parametrize("problem", ["unmarked", "no-train", "two-val", "val-path", "damaged-val"])
def test_bad_split_layouts_stop_at_start_with_one_line(tmp_path, problem):
    folder, overrides = tmp_path / "wds", []
    layouts = {"no-train": {"val": 5}, "damaged-val": {"train": 10}}
    write_named(folder, layouts.get(problem, {"train": 10, "val": 5}))
    if problem == "unmarked":
        write_foreign(folder, "cls", samples=3)  # 000000.tar
        expected = (
            f"data.path='{folder}' is not allowed; its shards' names mark their splits "
            "(train-*, val-*, validation-*, test-*) but 000000.tar marks none: rename it or "
            "move it out"
        )
    elif problem == "no-train":
        expected = (
            f"data.path='{folder}' is not allowed; its shards' names mark no training shards "
            "(train-*.tar), only val-*"
        )
    elif problem == "two-val":
        overrides = [f"data.val_path={folder / 'val-000000.tar'}"]
        expected = (
            f"data.val_path='{folder / 'val-000000.tar'}' is not allowed; data.path='{folder}' "
            "holds validation shards already: leave data.val_path unset, or point data.path at "
            "the training shards alone"
        )
    elif problem == "val-path":
        with pytest.raises(ConfigError) as error:
            check_config(foreign_cfg(folder, f"data.val_path={tmp_path}/nothing"))
        assert str(error.value) == (
            f"data.val_path='{tmp_path}/nothing' is not allowed; no such folder; expected a "
            "shard folder, one .tar or a list of them ('/data/val-{000000..000099}.tar', "
            "'/data/val-*.tar')"
        )
        return
    else:  # a shard of data.val_path cut short: named by data.val_path
        write_foreign(tmp_path / "held", "cls", samples=12)
        ending = cut_or_overwrite(tmp_path / "held/000001.tar", "in-member")
        overrides = [f"data.val_path={tmp_path / 'held'}"]
        expected = (
            f"data.val_path='{tmp_path / 'held'}' is not allowed; shard "
            f"{tmp_path / 'held/000001.tar'} {ending}"
        )
    cfg = foreign_cfg(folder, *overrides)
    check_config(cfg)
    with pytest.raises(ConfigError) as error:
        data_batches(cfg, CPU)
    assert str(error.value) == expected
