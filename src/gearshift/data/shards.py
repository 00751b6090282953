"""Tar shards in the WebDataset layout: written by `scripts/make_shards.py`, read by `data=shards`.

A shard folder holds `000000.tar`, `000001.tar`, ... and `index.json`. Each sample is two tar
members with one key: `<key>.jpg` (the image's bytes: the source file as it is, or a resized
JPEG copy; a non-JPEG source keeps its own extension) and `<key>.cls` (the label, decimal
ASCII), as WebDataset, litdata's and Hugging Face's webdataset readers expect. The index
says, per shard, how many samples it holds and where each image's bytes start and end in
the file, so a reader knows the lengths without opening a tar and reads any sample, or any
shard from any member on, with one seek (docs/gears.md, "Sharded images"). Shards written by
other tools, without index.json, get the same index from their tar headers
(data/tar_index.py: cached outside the data folder; labels from `data.label_key`), also
when `data.path` is one tar or a brace list (`/data/train-{000000..000099}.tar`); a folder
of `train-*.tar` + `val-*.tar` splits by the names, and `data.val_path` names the validation
shards where `data.path` holds none (`split_sources`).

Reading (`ShardImages`): a sample is one `os.pread` of its image bytes out of the shard
(each process opens the shards it touches once), decoded by data/decode.py's decoders into
a uint8 image of the training size, like `data=imagefolder`. Bytes that do not decode, or a
shard shorter than its index says, raise `UnreadableImage` naming the shard and the member.
`data.streaming=true` (`ShardStream`): the shards as pieces of a stream (data/streams.py),
each read in file order from any member on by `read_members`: one seek, then sequential
reads.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tarfile
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from gearshift.config import ConfigError
from gearshift.data.decode import ImageDecoder, UnreadableImage, centre_square, choose_decoder
from gearshift.data.images import device_stage, host_transform, take
from gearshift.data.streams import Stream
from gearshift.data.tar_index import index_from_headers, shard_files, splits_by_name

log = logging.getLogger(__name__)

INDEX = "index.json"
INDEX_FORMAT = "gearshift-shards/1"
TMP_INFIX = ".tmp-"


def shard_name(number: int) -> str:
    return f"{number:06d}.tar"


# ---------------------------------------------------------------- writing


def _add(tar: tarfile.TarFile, name: str, data: bytes, mtime: float) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), int(mtime), 0o644
    tar.addfile(info, _Reader(data))


class _Reader:
    """bytes as the file object `TarFile.addfile` reads from (no BytesIO copy)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = memoryview(data), 0

    def read(self, size: int = -1) -> bytes:
        end = len(self.data) if size < 0 else self.at + size
        chunk, self.at = self.data[self.at : end], min(end, len(self.data))
        return bytes(chunk)


def _member_table(path: Path) -> dict[str, tuple[int, int]]:
    """name -> (offset of its data, size): what the index records, read back from the tar."""
    with tarfile.open(path) as tar:
        return {m.name: (m.offset_data, m.size) for m in tar.getmembers()}


def write_split(
    items: Iterable[tuple[bytes, str, int]], target: Path, shard_bytes: int, first_key: int = 0
) -> list[dict[str, Any]]:
    """Write `items` ((image bytes, member extension, label)) as shards in `target`; their
    index entries. A shard is closed before the next sample would take it past
    `shard_bytes` (a shard holds at least one sample)."""
    target.mkdir(parents=True)
    shards: list[dict[str, Any]] = []
    tar, members, labels, size = None, [], [], 0

    def close() -> None:
        assert tar is not None
        tar.close()
        name = shard_name(len(shards))
        table = _member_table(target / name)
        offsets = [table[m] for m in members]
        shards.append(
            {
                "file": name,
                "samples": len(members),
                "members": list(members),
                "offsets": [o for o, _ in offsets],
                "sizes": [s for _, s in offsets],
                "labels": list(labels),
            }
        )

    now = time.time()
    for number, (data, extension, label) in enumerate(items):
        label_bytes = str(label).encode()
        cost = 1024 + len(data) + len(label_bytes)  # two 512-byte headers, then the data
        if tar is not None and size + cost > shard_bytes:
            close()
            tar = None
        if tar is None:
            tar = tarfile.open(  # noqa: SIM115  (closed by close(), when the shard is full)
                target / shard_name(len(shards)), "w", format=tarfile.USTAR_FORMAT
            )
            members, labels, size = [], [], 0
        key = f"{first_key + number:08d}"
        _add(tar, f"{key}.{extension}", data, now)
        _add(tar, f"{key}.cls", label_bytes, now)
        members.append(f"{key}.{extension}")
        labels.append(int(label))
        size += cost
    if tar is not None:
        close()
    return shards


def write_shards(
    splits: dict[str, Iterable[tuple[bytes, str, int]]],
    classes: list[str],
    out: Path,
    shard_bytes: int,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`out`/<split>/000000.tar ... + `out`/<split>/index.json for each non-empty split.

    Written into a temporary folder that is renamed to `out` at the end: a folder with
    the final name is complete, and an interrupted run leaves none.
    """
    if out.exists():
        raise ConfigError(f"OUT={str(out)!r} is not allowed; it exists: choose a new folder")
    temporary = out.parent / f"{out.name}{TMP_INFIX}{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    written: dict[str, Any] = {}
    try:
        key = 0
        for split, items in splits.items():
            shards = write_split(items, temporary / split, shard_bytes, key)
            count = sum(s["samples"] for s in shards)
            if not count:
                shutil.rmtree(temporary / split)
                continue
            key += count
            index = {"format": INDEX_FORMAT, "classes": classes, **(extra or {}), "shards": shards}
            (temporary / split / INDEX).write_text(json.dumps(index))
            written[split] = {"samples": count, "shards": len(shards)}
        os.rename(temporary, out)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return written


# ---------------------------------------------------------------- reading


def _bad(named: str, reason: str) -> ConfigError:
    return ConfigError(f"{named} is not allowed; {reason}")


def read_index(folder: Path, named: str) -> dict[str, Any]:
    """A split's index.json, checked against its shards (present, long enough); bad:
    ConfigError, starting with `named` (`data.path='...'`)."""
    file = folder / INDEX
    try:
        index = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        raise _bad(named, f"{file} cannot be read: {error}") from None
    if index.get("format") != INDEX_FORMAT:
        raise _bad(named, f"{file} is not a {INDEX_FORMAT} index")
    shards = index.get("shards") or []
    if not shards or not any(s["samples"] for s in shards):
        raise _bad(named, f"{file} lists no shards (an empty shard list)")
    _check_lengths(folder, index, named, f"listed in {file}", "its index says")
    return index


def _check_lengths(folder: Path, index: dict[str, Any], named: str, listed: str, says: str):
    for shard in index["shards"]:
        path = folder / shard["file"]
        ends = [o + s for o, s in zip(shard["offsets"], shard["sizes"], strict=True)]
        if not path.is_file():
            raise _bad(named, f"shard {path} {listed} does not exist")
        length = path.stat().st_size
        if length < max(ends, default=0):  # cut short: the samples past the end are gone
            first = next(n for n, end in enumerate(ends) if end > length)
            raise _bad(
                named,
                f"shard {path} holds {length} bytes, {says} at least {max(ends)}: member "
                f"{shard['members'][first]} ends at byte {ends[first]}, past the end; "
                "the shard is truncated; write it again",
            )


def read_split(
    where: Path | str | list[Path],
    source: str,
    label_key: str,
    classes: list[str] | None = None,
    setting: str = "data.path",
) -> tuple[dict[str, Any], Path]:
    """A split's index and the folder its shard names are relative to: its index.json where
    `where` is a folder with one (make_shards.py's), else built from the tar headers of the
    shards `where` names (data/tar_index.py): a folder of tars, one tar, a brace list, or
    the files themselves. "classes" None: integer labels, counted by data.num_classes.
    Errors name `setting`=`source`."""
    named = f"{setting}={source!r}"
    if isinstance(where, list):
        files = where
    else:
        folder = Path(where).expanduser()
        if folder.is_dir() and (folder / INDEX).is_file():
            return read_index(folder, named), folder
        files = shard_files(str(where), setting)
        if not files:
            raise _bad(named, f"{folder} holds no shards (.tar files)")
    index = index_from_headers(files, label_key, source, classes, setting)
    if not any(s["samples"] for s in index["shards"]):
        raise _bad(named, f"its {len(files)} shards hold no samples")
    _check_lengths(Path(), index, named, "", "its tar headers say")
    return index, Path()


class ShardSamples:
    """The samples of a split's shards as flat arrays, indexed 0..n-1 in shard order."""

    def __init__(self, folder: Path, index: dict[str, Any]) -> None:
        shards = index["shards"]
        self.folder, self.classes = folder, list(index["classes"])
        self.files = [str(folder / s["file"]) for s in shards]
        counts = [s["samples"] for s in shards]
        self.counts = np.asarray(counts, dtype=np.int64)
        self.first = np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)
        self.shard = np.repeat(np.arange(len(shards), dtype=np.int32), counts)
        self.offsets = np.concatenate([np.asarray(s["offsets"], np.int64) for s in shards])
        self.sizes = np.concatenate([np.asarray(s["sizes"], np.int64) for s in shards])
        self.labels = np.concatenate([np.asarray(s["labels"], np.int64) for s in shards])
        self.members = [m for s in shards for m in s["members"]]

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, keep: list[int] | None) -> ShardSamples:
        if keep is None:
            return self
        chosen = np.asarray(keep, dtype=np.int64)
        for name in ("shard", "offsets", "sizes", "labels"):
            setattr(self, name, getattr(self, name)[chosen])
        self.members = [self.members[i] for i in keep]
        # `keep` is sorted: the samples stay grouped by shard, in file order
        self.counts = np.bincount(self.shard, minlength=len(self.files)).astype(np.int64)
        self.first = np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)
        return self

    def where(self, i: int) -> str:
        """`<shard path>:<member>`: how errors name sample `i`."""
        return f"{self.files[self.shard[i]]}:{self.members[i]}"


class ShardReader:
    """Reads image bytes out of shards: one open file per shard and process, `os.pread`."""

    def __init__(self, samples: ShardSamples) -> None:
        self.samples = samples
        self.fds: dict[int, int] = {}  # opened in each process on first use

    def __getstate__(self) -> dict:
        return {**self.__dict__, "fds": {}}  # a file descriptor means nothing in a worker

    def __del__(self, close=os.close) -> None:
        # `close` is bound at definition: at interpreter exit this module's globals (os,
        # contextlib) may already be None; getattr: an __init__ that failed set no fds
        for fd in getattr(self, "fds", {}).values():
            try:  # noqa: SIM105 (contextlib may be None by then, as os)
                close(fd)
            except OSError:
                pass

    def read(self, i: int) -> bytes:
        samples = self.samples
        shard = int(samples.shard[i])
        try:
            fd = self.fds.get(shard)
            if fd is None:
                fd = self.fds[shard] = os.open(samples.files[shard], os.O_RDONLY)
            data = os.pread(fd, int(samples.sizes[i]), int(samples.offsets[i]))
        except OSError as error:
            raise UnreadableImage(f"cannot decode image {samples.where(i)}: {error}") from None
        if len(data) != samples.sizes[i]:
            raise UnreadableImage(
                f"cannot decode image {samples.where(i)}: the shard ends {len(data)} of "
                f"{samples.sizes[i]} bytes into it (a truncated shard)"
            )
        return data


def read_members(samples: ShardSamples, shard: int, member: int = 0) -> Iterator[tuple[int, bytes]]:
    """(sample number, image bytes) of shard `shard` from its `member`-th sample on, read in
    file order through one handle: the piece reader of a stream (sequential I/O)."""
    first = int(samples.first[shard])
    with open(samples.files[shard], "rb") as handle:
        for i in range(first + member, first + int(samples.counts[shard])):
            handle.seek(int(samples.offsets[i]))
            data = handle.read(int(samples.sizes[i]))
            if len(data) != samples.sizes[i]:
                raise UnreadableImage(
                    f"cannot decode image {samples.where(i)}: the shard ends "
                    f"{len(data)} of {samples.sizes[i]} bytes into it (a truncated shard)"
                )
            yield i, data


class ShardImages(Dataset):
    """`data=shards`: (uint8 image of the training size, label) per sample, read by index."""

    def __init__(
        self,
        samples: ShardSamples,
        decoder: ImageDecoder,
        transform: Any,
        device_transforms: dict[str, Any] | None,
        gears: dict[str, Any],
    ) -> None:
        self.samples, self.decoder, self.reader = samples, decoder, ShardReader(samples)
        self.size = decoder.size
        self.transform, self.device_transforms, self.gears = transform, device_transforms, gears

    def __len__(self) -> int:
        return len(self.samples)

    def image(self, i: int, data: bytes) -> torch.Tensor:
        image = centre_square(self.decoder.decode(self.samples.where(i), data), self.size)
        return image if self.transform is None else self.transform(image)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.image(i, self.reader.read(i)), int(self.samples.labels[i])


def shards(
    path: str,
    num_classes: int,
    image_size: int = 224,
    channels: int = 3,
    num_samples: int | None = None,
    num_val_samples: int | None = None,
    split_seed: int = 0,
    augment: bool = False,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    batch_dtype: str = "uint8",
    decoder: str = "auto",
    streaming: bool = False,
    label_key: str = "auto",
    val_path: str | None = None,
) -> tuple[ShardImages | ShardStream, ShardImages | ShardStream | None]:
    """`data=shards`: the splits `split_sources` finds at `path` (and `val_path`). Without
    index.json the index comes from the tar headers, the labels from the `label_key`
    members. Samples by index (`ShardImages`), or with `streaming` each shard read in file
    order (`ShardStream`)."""
    data = SimpleNamespace(**locals())
    sets: dict[str, ShardImages | None] = {"train": None, "val": None}
    chosen, classes = None, None
    for split, (where, setting, source) in split_sources(path, val_path).items():
        if split == "val" and num_val_samples == 0:
            continue
        index, folder = read_split(where, source, label_key, classes, setting)
        shown = where[0].parent if isinstance(where, list) else Path(where).expanduser()
        _check_classes(index, num_classes, shown)
        classes = index["classes"]
        samples = ShardSamples(folder, index)
        limit = num_samples if split == "train" else num_val_samples
        samples.subset(take(len(samples), limit, split_seed))
        if chosen is None:
            chosen = _choose_decoder(data, samples)
        reader, reason = chosen
        gears = {"data_batch_dtype": batch_dtype, "decoder": reader.name, "decoder_reason": reason}
        sets[split] = ShardImages(
            samples, reader, host_transform(data, split == "train"), device_stage(data), gears
        )
    train, val = sets["train"], sets["val"]
    assert train is not None
    log.info(
        "data: %d training and %d validation samples in %d + %d shards from %s",
        len(train), len(val) if val else 0, len(train.samples.files),
        len(val.samples.files) if val else 0, path,
    )  # fmt: skip
    if streaming:
        return ShardStream(train), (ShardStream(val) if val is not None else None)
    return train, val


Shards = Path | str | list[Path]  # a folder, a tar list (one .tar, a brace list, a glob), files


def split_sources(path: str, val_path: str | None) -> dict[str, tuple[Shards, str, str]]:
    """Each split's shards, with the setting and value that name them in errors:
    `path`/train/ (+ `path`/val/), make_shards.py's layout; a folder whose shard names mark
    their splits (train-*, val-*, validation-*; test-* is left out: neither trained on nor
    validated); else `path` holds the training shards alone. `val_path`: the validation
    shards, where `path` holds none."""
    root = Path(path).expanduser()
    found: dict[str, Shards | None]
    if (root / "train").is_dir():
        found = {"train": root / "train", "val": root / "val" if (root / "val").is_dir() else None}
    elif root.is_dir() and not (root / INDEX).is_file():
        named = splits_by_name(shard_files(path), path)
        found = {"train": root, "val": None} if named is None else {
            "train": named["train"], "val": named["val"] or None
        }  # fmt: skip
        if named is not None and named["test"]:
            log.info(
                "data: %d test shards in %s left out (neither trained on nor validated)",
                len(named["test"]), path,
            )  # fmt: skip
    else:  # make_shards.py's one split with index.json, or a tar list
        found = {"train": root if root.is_dir() else path, "val": None}
    splits = {
        split: (where, "data.path", path) for split, where in found.items() if where is not None
    }
    if val_path is not None:
        if "val" in splits:
            raise ConfigError(
                f"data.val_path={val_path!r} is not allowed; data.path={path!r} holds "
                "validation shards already: leave data.val_path unset, or point data.path at "
                "the training shards alone"
            )
        splits["val"] = (val_path, "data.val_path", val_path)
    return splits


def _check_classes(index: dict[str, Any], num_classes: int, folder: Path) -> None:
    """data.num_classes against the shards' classes (names), or their integer labels' range
    (an index from tar headers); the latter then get names "0".."n-1"."""
    names = index["classes"]
    if names is None:
        labels = [x for s in index["shards"] for x in s["labels"]]
        low, high = min(labels), max(labels)
        if low < 0 or high >= num_classes:
            fix = f"; set data.num_classes={high + 1}" if low >= 0 else ""
            raise ConfigError(
                f"data.num_classes={num_classes} is not allowed; the shards in {folder} hold "
                f"labels {low}..{high}, expected 0..{num_classes - 1}{fix}"
            )
        index["classes"] = [str(n) for n in range(num_classes)]
        return
    if len(names) != num_classes:
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise ConfigError(
            f"data.num_classes={num_classes} is not allowed; the shards in {folder} have "
            f"{len(names)} classes ({shown}); set data.num_classes={len(names)}"
        )


def _choose_decoder(data: SimpleNamespace, samples: ShardSamples) -> tuple[ImageDecoder, str]:
    """`data.decoder`: auto's rule reads a few images' sizes; here from their bytes."""
    import tempfile

    if data.decoder != "auto":
        return choose_decoder(data.decoder, [], data.channels, data.image_size)
    reader = ShardReader(samples)
    picks = np.linspace(0, len(samples) - 1, num=min(16, len(samples))).astype(int)
    with tempfile.TemporaryDirectory() as scratch:  # choose_decoder reads files' headers
        paths = []
        for n, i in enumerate(picks):
            file = Path(scratch) / f"{n}.img"
            file.write_bytes(reader.read(int(i)))
            paths.append(str(file))
        decoder, reason = choose_decoder("auto", paths, data.channels, data.image_size)
    return decoder, reason


class ShardStream(Stream):
    """`data.streaming=true`: the shards as a stream of pieces, one shard each (data/streams.py
    deals them to ranks and workers and keeps the position): a worker reads a shard in file
    order from any member on, one seek and then sequential reads, so a resumed run starts
    where it stopped without reading the trained samples again."""

    shuffle_block = 256  # samples a worker holds to shuffle: about 30 MB of 224 px JPEGs

    def __init__(self, images: ShardImages) -> None:
        self.images = images
        self.device_transforms, self.gears = images.device_transforms, images.gears

    def piece_lengths(self) -> list[int]:
        return [int(n) for n in self.images.samples.counts]

    def read(self, piece: int, offset: int) -> Iterator[tuple[torch.Tensor, int]]:
        labels = self.images.samples.labels
        for i, data in read_members(self.images.samples, piece, offset):
            yield self.images.image(i, data), int(labels[i])
