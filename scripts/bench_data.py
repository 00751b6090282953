"""How fast do real images load? Each of gearshift's image loaders against the standard recipe.

The standard torchvision recipe: `ImageFolder` (PIL), `Resize(256)`, `CenterCrop(224)`,
`ToTensor()`, `Normalize(ImageNet's mean and std)`, a shuffling `DataLoader`. Against it:
gearshift's `data=imagefolder` in each configuration (float32 batches made on the host,
uint8 batches with each decoder, the staged resized copies, and on CUDA `data.decode=gpu`),
`data=shards` (the folder written as tar shards by scripts/make_shards.py, as they are and
resized, and the same tars without index.json, indexed from their headers as a shard set of
another tool is; the time to index 10,000 members that way is printed first) and `data=hf` (the folder as a Parquet file of image bytes and labels),
all on the same generated folder of JPEGs (about 400x400, like ImageNet's), at the same
image size, batch size and number of workers. A configuration's time is one epoch of
loading with no model: the loader's batches, copied to the device (CPU: none) and made
into normalised float32 images there (`device_transforms`: what the loop does with
uint8 batches), so every row ends with the same kind of batch. `--host-only` times the
loader's batches as they come (the host's share of a GPU run, where the device finishes
uint8 batches; on a CPU that share is all there is to parallelise over workers). Repeats are interleaved
(recipe, a, b, ..., recipe, a, b, ...), so a shared machine's slow stretches hit every row
alike; the table shows medians, img/s per worker core, the ratio of the medians to the
recipe's and the median of each round's ratio to the recipe's epoch of that round.

A second table times each JPEG decoder (decode + centre square + resize, one thread) on
JPEGs of several source sizes: the figures behind `data.decoder=auto`'s rule.

    python scripts/bench_data.py                        # 1000 JPEGs, 2 workers, 3 repeats
    python scripts/bench_data.py --images 1500 --repeats 5 --workers 4
    python scripts/bench_data.py --host-only --no-decoders  # the loaders alone
    python scripts/bench_data.py --folder /data/imagenet/val --classes 1000
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import shutil
import statistics
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from PIL import Image
from rich.console import Console
from rich.table import Table
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

from gearshift.data.decode import JPEG_DECODERS, installed, time_decoders
from gearshift.data.device_transforms import DeviceTransforms
from gearshift.data.loading import to_device
from gearshift.data.resized import stored_side
from gearshift.data.transforms_off import source_transforms
from gearshift.data_batches import data_batches

CONF = Path(__file__).resolve().parents[1] / "conf"
HAS_SHARDS = find_spec("gearshift.data.shards") is not None  # data=shards, unless deleted
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def photo(height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """Smooth colour regions with a little grain: compresses about like a photograph."""
    coarse = rng.uniform(0, 255, (height // 24 + 2, width // 24 + 2, 3)).astype(np.uint8)
    smooth = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC), float)
    return np.clip(smooth + rng.normal(0, 5, smooth.shape), 0, 255).astype(np.uint8)


def write_folder(root: Path, images: int, classes: int, size: tuple[int, int]) -> None:
    rng = np.random.default_rng(0)
    for i in range(images):
        folder = root / f"class{i % classes:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        jitter = rng.integers(-40, 41, 2)  # sizes vary around `size`, as real folders do
        height, width = size[0] + int(jitter[0]), size[1] + int(jitter[1])
        Image.fromarray(photo(height, width, rng)).save(folder / f"{i:06d}.jpg", quality=90)


# ---------------------------------------------------------------- the loaders


def recipe(folder: Path, size: int, batch: int, workers: int, pin: bool) -> Iterable:
    """The standard torchvision recipe (Resize to 256/224 of the size, as for 224)."""
    transform = transforms.Compose(
        [
            transforms.Resize(round(size * 256 / 224)),
            transforms.CenterCrop(size),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )
    dataset = datasets.ImageFolder(str(folder), transform=transform)
    return DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers, pin_memory=pin)


def gearshift_loader(overrides: list[str], device: torch.device) -> tuple[Iterable, Callable]:
    """gearshift's training batches for `overrides`, and what the loop does with each."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    train, _ = data_batches(cfg, device)
    dataset = getattr(train, "dataset", None)
    finish = DeviceTransforms(
        cfg.device_transforms, device, torch.contiguous_format, 0, source_transforms(dataset)
    )

    def place(batch):
        inputs, _ = to_device(batch, device, True, torch.contiguous_format)
        return finish(inputs, train=True)

    return train, place


def one_epoch(batches: Iterable, place: Callable, device: torch.device, epoch: int) -> float:
    """img/s of one epoch of `batches`, each made into normalised floats on `device`."""
    if hasattr(batches, "set_epoch"):
        batches.set_epoch(epoch)
    count, start = 0, time.perf_counter()
    for batch in batches:
        images = place(batch)
        count += len(images)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return count / (time.perf_counter() - start)


def _inputs(batch):
    return batch[0]


def configurations(
    folder: Path, stage: Path, args: argparse.Namespace, device: torch.device
) -> dict[str, Callable[[], tuple[Iterable, Callable]]]:
    """name -> a builder of (batches, place)."""
    pin = device.type == "cuda"
    common = [
        "data=imagefolder",
        f"data.path={folder}",
        f"data.num_classes={args.classes}",
        f"data.image_size={args.size}",
        "data.num_samples=null",
        "data.num_val_samples=0",
        "data.check_images=off",
        f"batch_size={args.batch}",
        f"dataloader.num_workers={args.workers}",
        f"dataloader.pin_memory={pin}",
        f"device={device.type}",
        "logger=none",
    ]

    def ours(*extra: str):
        return lambda: gearshift_loader([*common, *extra], device)

    def theirs():
        to = (lambda b: b[0].to(device, non_blocking=True)) if pin else (lambda b: b[0])
        return recipe(folder, args.size, args.batch, args.workers, pin), to

    rows = {
        "torchvision recipe": theirs,
        "float32, pil": ours("data.batch_dtype=float32", "data.decoder=pil"),
    }
    for name in [n for n in JPEG_DECODERS if installed(n)]:
        rows[f"uint8, {name}"] = ours(f"data.decoder={name}")
    staged = (f"data.stage_to={stage}", "data.decoder=auto")
    rows["uint8, staged jpeg"] = ours(*staged, "data.stage_format=jpeg")
    rows["uint8, staged raw"] = ours(*staged, "data.stage_format=raw")
    packed = [  # the keys data=shards and data=hf share
        f"data.num_classes={args.classes}", f"data.image_size={args.size}",
        "data.num_samples=null", "data.num_val_samples=0", f"batch_size={args.batch}",
        f"dataloader.num_workers={args.workers}", f"dataloader.pin_memory={pin}",
        f"device={device.type}", "logger=none",
    ]  # fmt: skip
    if HAS_SHARDS:
        rows.update(shard_rows(folder, stage, packed, args.size, device))
    if installed_hf():
        rows["uint8, data=hf (Parquet)"] = lambda: gearshift_loader(
            ["data=hf", *packed, f"data.path={write_parquet(folder, stage / 'parquet')}"], device
        )
    if device.type != "cuda":
        return rows
    # data.decode=gpu (nvJPEG), CUDA only: a line each, for a fork deleting it (docs/layout.md)
    rows["decode=gpu (nvJPEG)"] = ours("data.decode=gpu")
    rows["decode=gpu, staged jpeg"] = ours(*staged, "data.stage_format=jpeg", "data.decode=gpu")
    return rows


def shard_rows(folder: Path, stage: Path, packed: list[str], size: int, device: torch.device):
    """data=shards' rows: the folder as tar shards, as they are and resized, with and
    without index.json."""
    from make_shards import make_shards  # scripts/make_shards.py, beside this one

    shards = ["data=shards", *packed]
    rows = {}

    def written(resize: int | None) -> Path:
        out = stage / f"shards-{resize or 'source'}"
        if not out.exists():
            make_shards(folder, out, shard_mb=16, resize=resize, val_fraction=0)
        return out

    def from_shards(resize: int | None, *extra: str):
        return lambda: gearshift_loader([*shards, f"data.path={written(resize)}", *extra], device)

    def from_headers():  # the same tars as another tool leaves them: no index.json
        out = stage / "shards-headers"
        if not out.exists():
            shutil.copytree(written(None), out)
            for index in out.rglob("index.json"):
                index.unlink()
        return gearshift_loader([*shards, f"data.path={out}"], device)

    resized = f"{stored_side('jpeg', size)} px JPEGs"
    rows["uint8, shards (source JPEGs)"] = from_shards(None)
    rows["uint8, shards (source JPEGs), no index.json"] = from_headers
    rows[f"uint8, shards --resize ({resized})"] = from_shards(size)
    rows[f"uint8, shards --resize ({resized}), streaming"] = from_shards(
        size, "data.streaming=true"
    )
    return rows


def index_build_time(root: Path, members: int = 10_000) -> tuple[float, float]:
    """Seconds to index `members` tar members (a .jpg and a .cls per sample, 10 tars) from
    their headers with no index.json: cold, then from the cache data/tar_index.py keeps."""
    from gearshift.data.tar_index import index_from_headers

    folder, payload = root / "index-bench", bytes(20_000)  # an image's size; never decoded
    folder.mkdir()
    for t in range(10):
        with tarfile.open(folder / f"{t:06d}.tar", "w") as tar:
            for n in range(t * members // 20, (t + 1) * members // 20):
                for name, data in ((f"{n:06d}.jpg", payload), (f"{n:06d}.cls", b"%d" % (n % 10))):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    files, times = sorted(folder.glob("*.tar")), []
    for _ in range(2):
        start = time.perf_counter()
        index = index_from_headers(files, "auto", str(folder))
        times.append(time.perf_counter() - start)
    assert sum(s["samples"] for s in index["shards"]) == members // 2
    return times[0], times[1]


def installed_hf() -> bool:
    """data=hf's row: the source (unless deleted) and the datasets library (an extra)."""
    try:
        import datasets  # noqa: F401

        import gearshift.data.hf  # noqa: F401
    except ImportError:
        return False
    return True


def write_parquet(folder: Path, out: Path) -> Path:
    """The image folder as a Parquet file of (image bytes, label): a Hub dataset's layout."""
    from datasets import ClassLabel, Dataset, Features
    from datasets import Image as ImageFeature

    from gearshift.data.images import index_class_folders

    classes, samples = index_class_folders(folder)
    features = Features({"image": ImageFeature(), "label": ClassLabel(names=classes)})
    rows = {
        "image": [{"bytes": Path(path).read_bytes(), "path": None} for path, _ in samples],
        "label": [label for _, label in samples],
    }
    out.mkdir(parents=True)
    Dataset.from_dict(rows, features=features).to_parquet(out / "train-00000-of-00001.parquet")
    return out


def decoder_table(root: Path, size: int, sizes: list[tuple[int, int]]) -> Table:
    table = Table(title=f"JPEG decoders: ms per image at {size} px (one thread, best of 3)")
    names = [n for n in JPEG_DECODERS if installed(n)]
    table.add_column("source")
    for name in names:
        table.add_column(name, justify="right")
    rng = np.random.default_rng(1)
    for height, width in sizes:
        folder = root / f"decoders-{width}x{height}"
        folder.mkdir()
        for i in range(16):
            Image.fromarray(photo(height, width, rng)).save(folder / f"{i}.jpg", quality=90)
        timings = time_decoders([str(p) for p in folder.iterdir()], 3, size)
        table.add_row(f"{width}x{height}", *(f"{timings[n] * 1e3:.2f}" for n in names))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--folder", type=Path, help="an image folder of yours (default: generated)")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=min(4, len(os.sched_getaffinity(0))))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--only", nargs="*", help="rows to run (default: all)")
    parser.add_argument("--no-decoders", action="store_true", help="skip the decoder table")
    parser.add_argument(
        "--host-only",
        action="store_true",
        help="time the batches as the loader yields them (uint8 rows: not yet made floats, "
        "as on a GPU machine, where the device does that); default on CUDA rows: never",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    console, device = Console(), torch.device(args.device)
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        root = Path(tmp)
        folder = args.folder or root / "images"
        if args.folder is None:
            start = time.perf_counter()
            write_folder(folder, args.images, args.classes, (400, 400))
            console.print(
                f"wrote {args.images} JPEGs of about 400x400 in {time.perf_counter() - start:.0f} s"
            )
        if not args.no_decoders:
            sizes = [(258, 258), (400, 400), (375, 500), (750, 1000)]
            console.print(decoder_table(root, args.size, sizes))
        os.environ["GEARSHIFT_CACHE"] = str(root / "cache")  # the header index's, not ~'s
        if HAS_SHARDS:
            cold, cached = index_build_time(root)
            console.print(
                f"10,000 tar members indexed from their headers: {cold:.3f} s cold, "
                f"{cached:.3f} s from the cache"
            )
        rows = configurations(folder, root / "stage", args, device)
        if args.only:
            rows = {
                name: rows[name] for name in rows if name in args.only or name.startswith("torch")
            }
        built = {}
        for name, build in rows.items():  # staging happens here, once, outside the timing
            start = time.perf_counter()
            built[name] = build()
            if "staged" in name or "shards" in name or "hf" in name:
                console.print(f"{name}: written in {time.perf_counter() - start:.1f} s")
        speeds: dict[str, list[float]] = {name: [] for name in rows}
        for repeat in range(args.repeats):
            for name, (batches, place) in built.items():
                if args.host_only and device.type == "cpu":
                    place = _inputs
                speeds[name].append(one_epoch(batches, place, device, repeat))
    cores = max(1, args.workers)
    what = "the loader's batches" if args.host_only else f"normalised floats on {device}"
    table = Table(
        title=f"{args.images} JPEGs at {args.size} px, batch {args.batch}, {args.workers} workers, "
        f"{what}, median of {args.repeats} interleaved epochs ({len(os.sched_getaffinity(0))} CPUs)"
    )
    columns = (
        "loader",
        "img/s",
        "img/s per worker",
        "x recipe",
        "x recipe, per round",
        "epochs (img/s)",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "loader" else "right")
    recipe_speeds = speeds["torchvision recipe"]
    base = statistics.median(recipe_speeds)
    for name, values in speeds.items():
        median = statistics.median(values)
        # each round against the recipe's epoch of the same round: drift in the machine's
        # speed between rounds cancels out
        rounds = statistics.median(v / r for v, r in zip(values, recipe_speeds, strict=True))
        table.add_row(
            name,
            f"{median:.0f}",
            f"{median / cores:.0f}",
            f"{median / base:.2f}",
            f"{rounds:.2f}",
            " ".join(f"{v:.0f}" for v in values),
        )
    console.print(table)


if __name__ == "__main__":
    main()
