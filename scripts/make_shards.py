"""Write an image folder as tar shards in the WebDataset layout, for data=shards.

    python scripts/make_shards.py /data/pets /data/pets-shards                 # 256 MB shards
    python scripts/make_shards.py /data/pets /data/pets-shards --shard-mb 64 --resize 224
    python train.py data=shards data.path=/data/pets-shards data.num_classes=37

The folder is read as `data=imagefolder` reads it: `SRC/<class>/<image>`, with
`--val-fraction` of every class held out (seeded by `--split-seed`, which also shuffles
the samples, so that every shard holds every class), or `SRC/train/<class>/...`
plus `SRC/val/<class>/...`. Writes `OUT/train/000000.tar, 000001.tar, ...` (and `OUT/val/...`),
each sample two members, `<key>.jpg` (the file's bytes; a PNG stays `<key>.png`) and
`<key>.cls` (its label), and `index.json` per split: the classes, each shard's sample count
and where each image's bytes lie in it, so readers know lengths and seek without scanning.
A shard is closed before it would pass `--shard-mb`. `--resize N` stores every image already
resized, like `data.stage_format=jpeg`: its centre square at 1.15 x N as a JPEG of
`--quality` (90, 4:4:4), so reading decodes a small JPEG. The folder is written under a
temporary name and renamed at the end: an interrupted run leaves no OUT.

    python scripts/make_shards.py --index /data/wds-shards --label-key json

indexes a shard set another tool wrote (webdataset, img2dataset: `<key>.jpg` + `<key>.cls`,
`.txt` or `.json` members, tars in SRC or in SRC/train + SRC/val): writes index.json beside
the tars, as data=shards would otherwise build it from the tar headers at every start on a
new machine (it caches it, data/tar_index.py). `--label-key` as data.label_key.
Bad input: one `error:` line and exit code 2.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from PIL import Image

from gearshift.config import ConfigError
from gearshift.data.decode import JPEG_MAGIC, UnreadableImage, choose_decoder
from gearshift.data.images import IMAGE_EXTENSIONS, index_class_folders, split_by_class
from gearshift.data.resized import stored_side
from gearshift.data.shards import INDEX, INDEX_FORMAT, write_shards
from gearshift.data.tar_index import index_from_headers, name_split

log = logging.getLogger("make_shards")


def read_folder(
    src: Path, val_fraction: float, split_seed: int
) -> tuple[list[str], dict[str, list[tuple[str, int]]]]:
    """(classes, {"train": [(path, label)], "val": [...]}) as data=imagefolder splits them."""
    if not src.is_dir():
        raise ConfigError(f"SRC={str(src)!r} is not allowed; no such folder")
    train_root = src / "train" if (src / "train").is_dir() else src
    classes, train = index_class_folders(train_root)
    if not train:
        raise ConfigError(
            f"SRC={str(src)!r} is not allowed; found no images ({', '.join(IMAGE_EXTENSIONS)}) "
            "in class folders; expected SRC/<class>/<image> or SRC/train/<class>/<image>"
        )
    if train_root != src and (src / "val").is_dir():
        try:
            _, val = index_class_folders(src / "val", classes)
        except ValueError as error:
            raise ConfigError(f"SRC={str(src)!r} is not allowed; {error}") from None
    else:
        train, val = split_by_class(train, val_fraction, split_seed)
    # Mixed classes in every shard: a reader that takes shards in turn, reading each from
    # start to end, then sees all classes at once (a shuffle buffer only mixes nearby samples).
    generator = torch.Generator().manual_seed(split_seed)
    mixed = {}
    for name, samples in (("train", train), ("val", val)):
        order = torch.randperm(len(samples), generator=generator).tolist()
        mixed[name] = [samples[i] for i in order]
    return classes, mixed


def image_bytes_of(
    resize: int | None, quality: int, channels: int, paths: list[str]
) -> Callable[[str], tuple[bytes, str]]:
    """path -> (bytes to store, member extension): the file itself, or a resized JPEG."""
    if resize is None:

        def as_is(path: str) -> tuple[bytes, str]:
            with open(path, "rb") as handle:
                data = handle.read()
            extension = "jpg" if data[:3] == JPEG_MAGIC else Path(path).suffix.lower()[1:]
            return data, extension

        return as_is
    side = stored_side("jpeg", resize)
    decoder, _ = choose_decoder("auto", paths, channels, side)

    def resized(path: str) -> tuple[bytes, str]:
        pixels = decoder(path).permute(1, 2, 0).numpy()  # the centre square at `side`
        out = io.BytesIO()
        Image.fromarray(pixels[..., 0] if channels == 1 else pixels).save(
            out, "JPEG", quality=quality, subsampling=0
        )
        return out.getvalue(), "jpg"

    return resized


def make_shards(
    src: Path,
    out: Path,
    shard_mb: float = 256,
    resize: int | None = None,
    quality: int = 90,
    channels: int = 3,
    val_fraction: float = 0.1,
    split_seed: int = 0,
) -> dict:
    """Write the shards; returns {split: {samples, shards}}. Bad input: ConfigError."""
    if shard_mb <= 0:
        raise ConfigError(f"--shard-mb={shard_mb} is not allowed; expected a number > 0")
    if not 0 <= val_fraction < 1:
        raise ConfigError(f"--val-fraction={val_fraction} is not allowed; expected 0 <= x < 1")
    if resize is not None and resize < 1:
        raise ConfigError(f"--resize={resize} is not allowed; expected a size >= 1 (pixels)")
    classes, splits = read_folder(src, val_fraction, split_seed)
    paths = [path for split in splits.values() for path, _ in split]
    image_bytes = image_bytes_of(resize, quality, channels, paths)
    extra = {"source": str(src), "resized": None if resize is None else stored_side("jpeg", resize)}
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, len(os.sched_getaffinity(0)))) as pool:
        items = {name: _encoded(pool, image_bytes, split, src) for name, split in splits.items()}
        written = write_shards(items, classes, out, round(shard_mb * 2**20), extra)
    log.info(
        "%s -> %s: %s in %.1f s",
        src, out, ", ".join(f"{k} {v['samples']} samples in {v['shards']} shards" for k, v in written.items()),
        time.perf_counter() - start,
    )  # fmt: skip
    return written


def _encoded(
    pool: ThreadPoolExecutor,
    image_bytes: Callable[[str], tuple[bytes, str]],
    samples: list[tuple[str, int]],
    src: Path,
    chunk: int = 256,
) -> Iterator[tuple[bytes, str, int]]:
    """(bytes, extension, label) in order, encoded `chunk` at a time in the pool's threads
    (PIL and torch let go of the GIL), so memory holds one chunk, not the dataset."""
    for first in range(0, len(samples), chunk):
        part = samples[first : first + chunk]
        try:
            encoded = list(pool.map(image_bytes, [path for path, _ in part]))
        except UnreadableImage as error:  # found before any shard is kept: named
            raise ConfigError(
                f"SRC={str(src)!r} is not allowed; {error}; remove or replace it"
            ) from None
        for (data, extension), (_, label) in zip(encoded, part, strict=True):
            yield data, extension, label


def index_shards(src: Path, label_key: str = "auto") -> dict:
    """index.json for each split folder of an existing shard set; {split: {samples, shards}}."""
    if not src.is_dir():
        raise ConfigError(f"SRC={str(src)!r} is not allowed; no such folder")
    folders = {"train": src / "train", "val": src / "val"} if (src / "train").is_dir() else {}
    folders = {k: v for k, v in folders.items() if v.is_dir()} or {"train": src}
    held_out = [f.name for f in sorted(src.glob("*.tar")) if name_split(f) in ("val", "test")]
    if folders["train"] == src and held_out:  # one index.json would train on them
        raise ConfigError(
            f"SRC={str(src)!r} is not allowed; its shards' names mark their splits "
            f"({held_out[0]}, ...): data=shards reads such a folder as it is; to index it, "
            "move them into SRC/train and SRC/val"
        )
    for folder in folders.values():
        if (folder / INDEX).exists():
            raise ConfigError(f"SRC={str(src)!r} is not allowed; {folder / INDEX} exists already")
    indexes, classes = {}, None
    for split, folder in folders.items():
        index = index_from_headers(sorted(folder.glob("*.tar")), label_key, str(folder), classes)
        classes = index["classes"] or classes
        indexes[split] = index
    if classes is None:  # integer labels: as many classes as the largest label says
        top = max(x for index in indexes.values() for s in index["shards"] for x in s["labels"])
        classes = [str(n) for n in range(top + 1)]
    written = {}
    for split, index in indexes.items():
        for shard in index["shards"]:
            shard["file"] = Path(shard["file"]).name  # beside index.json, as write_shards has it
        whole = {"format": INDEX_FORMAT, "source": "tar headers", **index, "classes": classes}
        temporary = folders[split] / f"{INDEX}.tmp-{os.getpid()}"
        temporary.write_text(json.dumps(whole))
        os.replace(temporary, folders[split] / INDEX)  # no half-written index.json
        written[split] = {
            "samples": sum(s["samples"] for s in index["shards"]),
            "shards": len(index["shards"]),
        }
    log.info("%s: index.json written (%s)", src, written)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path, help="the image folder (SRC/<class>/<image>)")
    parser.add_argument(
        "out", type=Path, nargs="?", help="the shard folder to write (must not exist)"
    )
    parser.add_argument("--index", action="store_true", help="index the shard set SRC instead")
    parser.add_argument("--label-key", default="auto", help="--index: as data.label_key")
    parser.add_argument("--shard-mb", type=float, default=256, help="largest shard, MB")
    parser.add_argument("--resize", type=int, default=None, help="store resized for this size")
    parser.add_argument("--quality", type=int, default=90, help="--resize: the JPEG quality")
    parser.add_argument("--channels", type=int, choices=(1, 3), default=3, help="--resize")
    parser.add_argument("--val-fraction", type=float, default=0.1, help="held out per class")
    parser.add_argument("--split-seed", type=int, default=0, help="the held-out split's seed")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.index:
            index_shards(args.src, args.label_key)
            return 0
        if args.out is None:
            raise ConfigError("OUT is missing; give the shard folder to write (or --index)")
        make_shards(
            args.src, args.out, args.shard_mb, args.resize, args.quality, args.channels,
            args.val_fraction, args.split_seed,
        )  # fmt: skip
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
