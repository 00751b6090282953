"""Sources read from disk: `data=imagefolder` (your images) and `data=cifar10`.

Both hand images over as uint8 tensors of `data.image_size` squared (decode.py; tip 6: built
with `torch.from_numpy`, no per-pixel Python). With `data.batch_dtype=uint8` (the default)
that is what a batch holds: the optional light augmentation, the float conversion and the
optional normalisation happen on the training device (`device_stage`, device_transforms.py).
With `float32` they happen here, per image, in torchvision's transforms v2 (`host_transform`).

Problems with the data itself (no images, a file that is not an image, a class count
other than `data.num_classes`) raise `ConfigError` here, before any training step, and
are reported like a bad config value: one line naming the key, the value and the fix.
"""

from __future__ import annotations

import logging
import os
import pickle
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from gearshift.config import ConfigError
from gearshift.data.decode import centre_square, choose_decoder
from gearshift.data.resized import stage_resized
from gearshift.data.staging import file_lock, stage

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")
CIFAR_FOLDER = "cifar-10-batches-py"
CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST = "test_batch"
CIFAR_SIZE = 32


def _bad_path(path: Path | str, reason: str) -> ConfigError:
    return ConfigError(f"data.path={str(path)!r} is not allowed; {reason}")


# ---------------------------------------------------------------- transforms


def host_transform(data: SimpleNamespace, train: bool) -> Callable | None:
    """What the host does to a uint8 CHW image of `data.image_size` squared, per sample.

    `data.batch_dtype=uint8`: nothing (None); the batch goes to the device as it is and
    `device_transforms` (see `device_stage`) does the rest there. `float32`: the optional
    augmentation (a padded random crop and a horizontal flip, training images only), float32
    in [0, 1], the optional normalisation, all here.
    """
    if data.batch_dtype == "uint8":
        return None
    from torchvision.transforms import v2  # lazily: see gpu_decode.py

    size, steps = data.image_size, []
    if data.augment and train:
        steps += [v2.RandomCrop(size, padding=crop_padding(size)), v2.RandomHorizontalFlip()]
    steps.append(v2.ToDtype(torch.float32, scale=True))
    if data.mean is not None:
        steps.append(v2.Normalize(list(data.mean), list(data.std)))
    return v2.Compose(steps)


def crop_padding(size: int) -> int:
    return max(1, size // 8)


def device_stage(data: SimpleNamespace) -> dict[str, Any] | None:
    """`data.batch_dtype=uint8`: the host's transforms, as device_transforms keys."""
    return source_stage(data) if data.batch_dtype == "uint8" else None


def source_stage(data: SimpleNamespace) -> dict[str, Any]:
    """`data.augment`, `data.mean` and `data.std` as device_transforms keys."""
    return {
        "normalize": data.mean is not None,
        "mean": list(data.mean or [0.0]),
        "std": list(data.std or [1.0]),
        "hflip": bool(data.augment),
        "crop_padding": crop_padding(data.image_size) if data.augment else 0,
    }


def take(count: int, limit: int | None, seed: int) -> list[int] | None:
    """Indices of a seeded random subset of `limit` out of `count` (None: keep all)."""
    if limit is None or limit >= count:
        return None
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    return sorted(order[:limit].tolist())


# ---------------------------------------------------------------- image folders


class ImageFiles(Dataset):
    """(path, label) pairs decoded on access, in the loader's worker processes.

    `read` turns a path into a uint8 CHW image of the training size: a decoder
    (decode.py), or the reader of a staged resized copy (resized.py).
    """

    def __init__(
        self,
        samples: Sequence[tuple[str, int]],
        classes: list[str],
        data: SimpleNamespace,
        train: bool,
        read: Callable[[str], torch.Tensor],
        gears: dict[str, Any],
    ) -> None:
        self.samples, self.classes, self.read = list(samples), classes, read
        self.transform = host_transform(data, train)
        self.device_transforms = device_stage(data)
        self.gears = gears  # how the images are read, for summary.json's gears

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        image = self.read(path)
        return (image if self.transform is None else self.transform(image)), label


def _visible_dirs(folder: Path) -> list[str]:
    return sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))


def _images_under(folder: Path) -> list[str]:
    """Image files anywhere below `folder`, sorted; hidden files and folders left out."""
    found = []
    for parent, dirs, files in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [
            os.path.join(parent, f)
            for f in sorted(files)
            if not f.startswith(".") and f.lower().endswith(IMAGE_EXTENSIONS)
        ]
    return found


def index_class_folders(
    root: Path, classes: list[str] | None = None
) -> tuple[list[str], list[tuple[str, int]]]:
    """(class names, (path, label) pairs) of `root`/<class>/<image>.

    Classes are the sorted subfolder names; pass the training set's `classes` to index a
    validation folder with the same labels.
    """
    names = _visible_dirs(root)
    if classes is None:
        classes = names
    else:
        unknown = sorted(set(names) - set(classes))
        if unknown:
            raise ValueError(f"{root} has class folder(s) not in train/: {', '.join(unknown)}")
    label_of = {name: i for i, name in enumerate(classes)}
    samples = [(path, label_of[name]) for name in names for path in _images_under(root / name)]
    return classes, samples


def split_by_class(
    samples: list[tuple[str, int]], fraction: float, seed: int
) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(train, val): a seeded `fraction` of every class goes to validation."""
    by_class: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for sample in samples:
        by_class[sample[1]].append(sample)
    generator = torch.Generator().manual_seed(seed)
    train, val = [], []
    for label in sorted(by_class):
        items = by_class[label]
        order = torch.randperm(len(items), generator=generator).tolist()
        cut = round(len(items) * fraction)
        val += [items[i] for i in order[:cut]]
        train += [items[i] for i in order[cut:]]
    return train, val


def _image_problem(path: str, decode: bool) -> str | None:
    """Why `path` cannot be used as an image, or None when it can."""
    try:
        with Image.open(path) as image:  # reads the header only
            if decode:
                image.load()
    except UnidentifiedImageError:
        return "not an image file PIL can read"
    except (OSError, ValueError) as error:
        return str(error) or type(error).__name__
    return None


def find_bad_images(paths: Sequence[str], how: str) -> list[tuple[str, str]]:
    """(path, why) for each unreadable file: `header` opens each file, `decode` loads it."""
    if how == "off" or not paths:
        return []
    decode = how == "decode"
    with ThreadPoolExecutor(max_workers=min(32, 4 * (os.cpu_count() or 1))) as pool:
        problems = list(pool.map(lambda p: _image_problem(p, decode), paths, chunksize=64))
    return [(path, problem) for path, problem in zip(paths, problems, strict=True) if problem]


def image_folder_datasets(data: SimpleNamespace, root: Path) -> tuple[Dataset, Dataset | None]:
    """`root`/train/<class>/... (+ `root`/val/<class>/...) or `root`/<class>/... split by ratio."""
    train_root = root / "train" if (root / "train").is_dir() else root
    classes, train = index_class_folders(train_root)
    if not train:
        raise _bad_path(
            data.path,
            f"found no images ({', '.join(IMAGE_EXTENSIONS)}) in class folders; "
            "expected data.path/<class>/<image> or data.path/train/<class>/<image>",
        )
    empty = sorted(set(classes) - {classes[label] for _, label in train})
    if empty:
        raise _bad_path(data.path, f"class folder(s) with no images: {', '.join(empty)}")
    if len(classes) != data.num_classes:
        shown = ", ".join(classes[:5]) + (", ..." if len(classes) > 5 else "")
        raise ConfigError(
            f"data.num_classes={data.num_classes} is not allowed; {train_root} has "
            f"{len(classes)} class folders ({shown}); set data.num_classes={len(classes)}"
        )
    if (root / "val").is_dir() and train_root != root:
        try:
            _, val = index_class_folders(root / "val", classes)
        except ValueError as error:
            raise _bad_path(data.path, f"{error}; rename or remove them") from None
    else:
        train, val = split_by_class(train, data.val_fraction, data.split_seed)
    train = _subset(train, data.num_samples, data.split_seed)
    val = _subset(val, data.num_val_samples, data.split_seed)
    bad = find_bad_images([path for path, _ in train + val], data.check_images)
    if bad:
        more = f" ({len(bad)} damaged files in all)" if len(bad) > 1 else ""
        raise _bad_path(data.path, f"{bad[0][0]}: {bad[0][1]}{more}; remove or replace it")
    log.info(
        "data: %d training and %d validation images in %d classes from %s",
        len(train),
        len(val),
        len(classes),
        root,
    )
    if data.decode == "gpu":  # workers read bytes, the device decodes (data/gpu_decode.py)
        return _jpeg_files(data, classes, train, val)
    read, gears = image_reader(data, [path for path, _ in train + val])
    train_set = ImageFiles(train, classes, data, True, read, gears)
    return train_set, (ImageFiles(val, classes, data, False, read, gears) if val else None)


def image_reader(
    data: SimpleNamespace, paths: list[str]
) -> tuple[Callable[[str], torch.Tensor], dict[str, Any]]:
    """(path -> uint8 image of the training size, the gears that say how): a staged resized
    copy with `data.stage_format=jpeg|raw`, else the fastest decoder (`data.decoder`)."""
    gears: dict[str, Any] = {"data_batch_dtype": data.batch_dtype}
    if data.stage_to and data.stage_format != "copy":
        staged = stage_resized(paths, data, Path(data.stage_to))
        log.info("data: reading %s", staged.describe())
        return staged, gears | {"staged": staged.describe()}
    decoder, reason = choose_decoder(data.decoder, paths, data.channels, data.image_size)
    log.info("data: decoding with %s (%s)", decoder.name, reason)
    return decoder, gears | {"decoder": decoder.name, "decoder_reason": reason}


def _jpeg_files(
    data: SimpleNamespace, classes: list[str], train: list, val: list
) -> tuple[Dataset, Dataset | None]:
    # lazily: data.decode=gpu's alone, a capability a fork may delete (docs/layout.md)
    from gearshift.data.gpu_decode import JpegFiles, find_non_jpegs

    if data.stage_to and data.stage_format == "jpeg":  # the device decodes the resized copy
        staged = stage_resized([path for path, _ in train + val], data, Path(data.stage_to))
        train, val = ([(staged.file_of(path), label) for path, label in s] for s in (train, val))
        log.info("data: reading the resized JPEG copy in %s", staged.folder)
    not_jpeg = find_non_jpegs([path for path, _ in train + val])
    if not_jpeg:
        more = f" ({len(not_jpeg)} non-JPEG files in all)" if len(not_jpeg) > 1 else ""
        raise ConfigError(
            f"data.decode='gpu' is not allowed; {not_jpeg[0][0]} is {not_jpeg[0][1]}{more}, "
            "and the device decodes JPEGs only; convert it or use data.decode=host"
        )
    log.info("data: the loader's workers read JPEG bytes; the training device decodes them")
    stage = source_stage(data)  # decoded batches are uint8 whatever data.batch_dtype says
    sets = [
        JpegFiles(samples, classes, data.image_size, data.channels, stage, train=t)
        for samples, t in ((train, True), (val, False))
    ]
    return sets[0], (sets[1] if val else None)


def _subset(samples: list, limit: int | None, seed: int) -> list:
    keep = take(len(samples), limit, seed)
    return samples if keep is None else [samples[i] for i in keep]


# ---------------------------------------------------------------- CIFAR-10


class TensorImageSet(Dataset):
    """uint8 NCHW images held in memory, resized on access to `data.image_size` when theirs
    differs, then through the host transform (none on the uint8 path)."""

    def __init__(
        self, images: torch.Tensor, labels: torch.Tensor, data: SimpleNamespace, train: bool
    ) -> None:
        self.images, self.labels, self.size = images, labels, data.image_size
        self.transform = host_transform(data, train)
        self.device_transforms = device_stage(data)
        self.gears = {"data_batch_dtype": data.batch_dtype}

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[index]
        if image.shape[-1] != self.size:
            image = centre_square(image, self.size)
        return (image if self.transform is None else self.transform(image)), self.labels[index]


def cifar_folder(root: Path) -> Path:
    """The folder holding the batch files: `root`/cifar-10-batches-py, or `root` itself."""
    for folder in (root / CIFAR_FOLDER, root):
        if (folder / CIFAR_TRAIN[0]).is_file():
            missing = [f for f in (*CIFAR_TRAIN, CIFAR_TEST) if not (folder / f).is_file()]
            if missing:
                raise _bad_path(root, f"{folder} lacks {', '.join(missing)}")
            return folder
    raise _bad_path(
        root,
        f"it holds no {CIFAR_FOLDER}/ with data_batch_1..5 and test_batch; "
        "point data.path at the folder that holds it, or set data.download=true",
    )


def read_cifar_batches(files: Sequence[Path]) -> tuple[torch.Tensor, torch.Tensor]:
    """CIFAR's pickled batches -> (uint8 N x 3 x 32 x 32, int64 N), via `from_numpy`."""
    images, labels = [], []
    for file in files:
        try:
            with open(file, "rb") as handle:
                batch = pickle.load(handle, encoding="latin1")
            images.append(np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            labels.append(np.asarray(batch["labels"], dtype=np.int64))
        except Exception as error:  # unpickling raises many kinds; all mean the same here
            raise ValueError(f"{file} is not a CIFAR-10 batch file ({error!r})") from error
    # One array each: per-item indexing of these tensors copies nothing (tip 6: from_numpy).
    return torch.from_numpy(np.concatenate(images)), torch.from_numpy(np.concatenate(labels))


def download_cifar(root: Path) -> None:
    """Fetch and verify the archive through torchvision, one process at a time."""
    from torchvision.datasets import CIFAR10

    root.mkdir(parents=True, exist_ok=True)
    with file_lock(root / ".gearshift-download.lock"):
        CIFAR10(str(root), train=True, download=True)


def cifar_datasets(
    data: SimpleNamespace, folder: Path
) -> tuple[TensorImageSet, TensorImageSet | None]:
    try:
        train_images, train_labels = read_cifar_batches([folder / f for f in CIFAR_TRAIN])
        val_images, val_labels = read_cifar_batches([folder / CIFAR_TEST])
    except ValueError as error:
        raise _bad_path(data.path, f"{error}; replace it with the original file") from None
    for labels in (train_labels, val_labels):
        if len(labels) and int(labels.max()) >= data.num_classes:
            raise _bad_path(data.path, f"it has label {int(labels.max())}; CIFAR-10 has 0..9")
    sets = []
    for images, labels, limit, train in (
        (train_images, train_labels, data.num_samples, True),
        (val_images, val_labels, data.num_val_samples, False),
    ):
        keep = take(len(labels), limit, data.split_seed)
        if keep is not None:
            images, labels = images[keep], labels[keep]
        sets.append(TensorImageSet(images, labels, data, train))
    log.info("data: CIFAR-10, %d training and %d test images from %s", *map(len, sets), folder)
    return sets[0], (sets[1] if len(sets[1]) else None)


# ---------------------------------------------------------------- the sources


def image_folder(
    path: str,
    num_classes: int,
    image_size: int = 224,
    channels: int = 3,
    num_samples: int | None = None,
    num_val_samples: int | None = None,
    val_fraction: float = 0.1,
    split_seed: int = 0,
    check_images: str = "header",
    augment: bool = False,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    stage_to: str | None = None,
    stage_format: str = "copy",
    stage_quality: int = 90,
    batch_dtype: str = "uint8",
    decoder: str = "auto",
    decode: str = "host",
) -> tuple[Dataset, Dataset | None]:
    """`data=imagefolder`: (train, validation or None) from a folder of class folders,
    staged to local disk first when `stage_to` is set (tip 1): the folder as it is
    (`stage_format=copy`), or every image pre-resized (`jpeg`, `raw`: resized.py);
    `decode="gpu"` hands the files' bytes over for decoding on the device (gpu_decode.py)."""
    options = SimpleNamespace(**locals())  # the keys, as the data node names them
    root = Path(path).expanduser()
    if stage_to and stage_format == "copy":
        root = stage(root, Path(stage_to))
    return image_folder_datasets(options, root)


def cifar10(
    path: str,
    num_classes: int = 10,
    image_size: int = 32,
    channels: int = 3,
    num_samples: int | None = None,
    num_val_samples: int | None = None,
    split_seed: int = 0,
    augment: bool = False,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    download: bool = False,
    stage_to: str | None = None,
    batch_dtype: str = "uint8",
) -> tuple[TensorImageSet, TensorImageSet | None]:
    """`data=cifar10`: the five training batches and the test batch (validation), fetched
    first with `download`, staged to local disk first with `stage_to` (tip 1)."""
    options = SimpleNamespace(**locals())
    root = Path(path).expanduser()
    if download:
        download_cifar(root)
    folder = cifar_folder(root)
    if stage_to:
        folder = stage(folder, Path(stage_to))
    return cifar_datasets(options, folder)
