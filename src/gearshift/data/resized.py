"""Staged resized copies (tip 1, fast local disk, taken further): every image a run reads,
decoded once, stored on local disk already at the training size, so an epoch's decoding
follows the training size and not the source's.

`data.stage_to=DIR data.stage_format=jpeg` stores the centre square of each image (the
region training keeps) at STAGE_SCALE x `data.image_size` as a JPEG of
`data.stage_quality`; reading one decodes a small JPEG and resizes it to the training size.
`data.stage_format=raw` stores the centre squares at the training size, uncompressed, in one
uint8 memory-mapped `.npy` file (C x size x size bytes per image, so for small images or
small datasets); reading one is a copy.

The copy is made once per node by `staging.stage` (a lock, a temporary folder, an atomic
rename: a half-written copy is never used). Its name hashes the source folder, the format,
the sizes and every image's path, byte size and modification time, so a changed source, size
or format makes a new copy. The samples (labels, split, order) are the source's; the copy
only answers "the pixels of this source file" (`StagedImages`).
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from PIL import Image

from gearshift.config import ConfigError
from gearshift.data.decode import UnreadableImage, centre_square, choose_decoder
from gearshift.data.staging import stage

STAGE_SCALE = 1.15  # jpeg: stored side / training size; room for the JPEG's blocks to blur out
MANIFEST = "manifest.json"
RAW_FILE = "images.npy"
PER_FOLDER = 4096  # JPEG files per subfolder


def stored_side(stage_format: str, size: int) -> int:
    return round(STAGE_SCALE * size) if stage_format == "jpeg" else size


def _fingerprint(root: Path, paths: list[str]) -> list[str]:
    """Each image as `relative path:bytes:mtime`: any change to the source changes it."""
    entries = []
    for path in paths:
        stat = os.stat(path)
        entries.append(f"{os.path.relpath(path, root)}:{stat.st_size}:{stat.st_mtime_ns}")
    return entries


def _jpeg_name(slot: int) -> str:
    return f"{slot // PER_FOLDER:05d}/{slot:08d}.jpg"


def _write_copy(
    paths: list[str], relative: list[str], data: SimpleNamespace, side: int, target: Path
) -> None:
    """Decode every image, keep its centre square at `side`, store it in `target`."""
    decoder, _ = choose_decoder(data.decoder, paths, data.channels, side)
    target.mkdir(parents=True)
    shape = (len(paths), data.channels, side, side)
    raw = None
    if data.stage_format == "raw":
        raw = np.lib.format.open_memmap(target / RAW_FILE, mode="w+", dtype=np.uint8, shape=shape)
    else:
        for folder in range(-(-len(paths) // PER_FOLDER)):
            (target / f"{folder:05d}").mkdir()

    def store(slot: int) -> None:
        image = decoder(paths[slot])  # uint8 C x side x side
        if raw is not None:
            raw[slot] = image.numpy()
            return
        pixels = image.permute(1, 2, 0).numpy()
        Image.fromarray(pixels[..., 0] if data.channels == 1 else pixels).save(
            target / _jpeg_name(slot), "JPEG", quality=data.stage_quality, subsampling=0
        )

    with ThreadPoolExecutor(max_workers=max(1, len(os.sched_getaffinity(0)))) as pool:
        list(pool.map(store, range(len(paths))))  # PIL and torch let go of the GIL here
    if raw is not None:
        raw.flush()
        del raw
    manifest = {
        "format": data.stage_format,
        "side": side,
        "channels": data.channels,
        "quality": data.stage_quality if data.stage_format == "jpeg" else None,
        "paths": relative,
    }
    (target / MANIFEST).write_text(json.dumps(manifest))


class StagedImages:
    """source path -> uint8 CHW image of the training size, from a staged resized copy."""

    def __init__(self, folder: Path, root: Path, data: SimpleNamespace) -> None:
        manifest = json.loads((folder / MANIFEST).read_text())
        self.folder, self.root = folder, root
        self.format, self.side = manifest["format"], manifest["side"]
        self.quality, self.size = manifest["quality"], data.image_size
        self.slots = {path: slot for slot, path in enumerate(manifest["paths"])}
        self.raw: np.ndarray | None = None  # opened in each process on first use
        self.decoder = None
        if self.format == "jpeg":
            sample = [str(folder / _jpeg_name(slot)) for slot in range(len(self.slots))]
            self.decoder, self.decoder_reason = choose_decoder(
                data.decoder, sample, data.channels, self.size
            )

    def describe(self) -> str:
        if self.format == "raw":
            return f"raw uint8 {self.side}px memmap in {self.folder}"
        assert self.decoder is not None
        return (
            f"jpeg q{self.quality} {self.side}px copy in {self.folder}, decoded with "
            f"{self.decoder.name} ({self.decoder_reason})"
        )

    def file_of(self, path: str) -> str:
        """The staged JPEG of source file `path` (`stage_format=jpeg`; data.decode=gpu reads it)."""
        return str(self.folder / _jpeg_name(self.slots[os.path.relpath(path, self.root)]))

    def __getstate__(self) -> dict:
        return {**self.__dict__, "raw": None}  # a memmap pickles as its whole contents

    def __call__(self, path: str) -> torch.Tensor:
        slot = self.slots[os.path.relpath(path, self.root)]
        if self.decoder is not None:
            return self.decoder(str(self.folder / _jpeg_name(slot)))
        if self.raw is None:
            self.raw = np.load(self.folder / RAW_FILE, mmap_mode="r")
        image = torch.from_numpy(np.array(self.raw[slot]))  # one copy, out of the page cache
        return centre_square(image, self.size)


def stage_resized(paths: list[str], data: SimpleNamespace, stage_to: Path) -> StagedImages:
    """The staged resized copy of `paths` (made now, once per node, if there is none yet)."""
    root = Path(data.path).expanduser()
    side = stored_side(data.stage_format, data.image_size)
    relative = [os.path.relpath(path, root) for path in paths]
    settings = f"{data.stage_format}:{side}:{data.channels}:{data.stage_quality}"
    entries = "\n".join([settings, *_fingerprint(root, paths)])
    key = hashlib.sha1(entries.encode()).hexdigest()

    def write(_source: Path, target: Path) -> None:
        try:
            _write_copy(paths, relative, data, side, target)
        except UnreadableImage as error:  # found before training: a data problem, named
            raise ConfigError(
                f"data.path={data.path!r} is not allowed; {error}; remove or replace it"
            ) from None

    folder = stage(root, stage_to.expanduser(), copy=write, key=key)
    return StagedImages(folder, root, data)
