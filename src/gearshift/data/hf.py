"""`data=hf`: a Hugging Face `datasets` dataset as the source (optional extra: `pip install
'gearshift[hf]'`).

`data.path` is a `save_to_disk` folder (a Dataset or a DatasetDict), a folder of data files
(Parquet, Arrow, CSV, JSON: the splits come from the file names, `train-*.parquet`,
`validation-*.parquet`, as `datasets.load_dataset(folder)` reads them) or one such file;
`data.name` is a dataset on the Hub resolved offline from the local cache (nothing is
downloaded: HF_DATASETS_OFFLINE and HF_HUB_OFFLINE are set to 1 unless set already).

Map-style: random access by row, served by the same DataLoader and EpochSampler as
`data=imagefolder`, so order, sharding over ranks and exact resume are the template's; or
with `data.streaming=true` a stream of row ranges read in order (`HFStream`). The
image column is read as its encoded bytes (`datasets.Image(decode=False)`) and decoded in
the loader's workers by data/decode.py's decoders into a uint8 image of the training size,
the uint8 path of `data=imagefolder`. Labels come from the label column (its ClassLabel
names count the classes). A column the config names that the dataset lacks stops the run
at start with one line listing the columns it has.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
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

log = logging.getLogger(__name__)

PIECE_ROWS = 4096  # rows per piece of HFStream: the unit a stream shuffles and deals out
READ_ROWS = 64  # rows per Arrow slice a piece is read in
VAL_SPLITS = ("validation", "valid", "val", "test")
DATA_FILES = (".parquet", ".arrow", ".csv", ".json", ".jsonl")


def _datasets():
    """The `datasets` package, offline; or one line saying how to install it."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # read at import: no Hub requests
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            "data=hf is not allowed; the datasets package is not installed: "
            "pip install 'gearshift[hf]'"
        ) from None
    datasets.disable_progress_bars()  # the log says what was read
    return datasets


@contextmanager
def _offline(datasets: Any) -> Iterator[None]:
    """No Hub requests while `data.name` is resolved, also where `datasets` was imported
    before HF_HUB_OFFLINE was set (it reads the variable once, at import)."""
    import huggingface_hub.constants as hub

    saved = datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE = saved


def load(path: str | None, name: str | None) -> Any:
    """The Dataset or DatasetDict at `path` (a save_to_disk folder, a folder of data files,
    one data file) or, by `name`, from the local cache."""
    datasets = _datasets()
    if (path is None) == (name is None):
        raise ConfigError(
            f"data.path={path!r} is not allowed; data=hf reads either data.path (a folder "
            "or data files) or data.name (a dataset in the local cache): set one of them"
        )
    if name is not None:
        try:
            with _offline(datasets):
                return datasets.load_dataset(name)
        except Exception as error:  # the Hub client raises many kinds; all mean "not cached"
            raise ConfigError(
                f"data.name={name!r} is not allowed; it is not in the local Hugging Face "
                f"cache ({type(error).__name__}: {str(error).splitlines()[0][:200]}); "
                "download it once with internet, or point data.path at its files"
            ) from None
    where = Path(path).expanduser()
    if not where.exists():
        raise ConfigError(f"data.path={path!r} is not allowed; no such file or folder")
    if where.is_dir() and any((where / f).is_file() for f in ("dataset_dict.json", "state.json")):
        return datasets.load_from_disk(str(where))
    if where.is_file():
        kind = where.suffix.lower().lstrip(".").replace("jsonl", "json")
        if "." + kind not in DATA_FILES:
            raise ConfigError(
                f"data.path={path!r} is not allowed; expected a save_to_disk folder, a folder "
                f"of data files or one file ({', '.join(DATA_FILES)})"
            )
        return datasets.load_dataset(kind, data_files={"train": str(where)})
    if not any(p.suffix.lower() in DATA_FILES for p in where.rglob("*")):
        raise ConfigError(
            f"data.path={path!r} is not allowed; the folder holds no save_to_disk dataset "
            f"(dataset_dict.json or state.json) and no data files ({', '.join(DATA_FILES)})"
        )
    return datasets.load_dataset(str(where))


def splits(loaded: Any, split: str, val_split: str | None) -> tuple[Any, Any | None]:
    """(train, validation or None) of a Dataset or DatasetDict; a missing split is named.
    `val_split="auto"`: "validation", "valid", "val" or "test", the first present (or none)."""
    if not hasattr(loaded, "keys"):  # one Dataset: training only
        return loaded, None
    names = list(loaded.keys())
    if val_split == "auto":  # the usual names, in the order datasets' builders use them
        val_split = next((n for n in VAL_SPLITS if n in names and n != split), None)
    if split not in names:
        raise ConfigError(
            f"data.split={split!r} is not allowed; the dataset's splits are: {', '.join(names)}"
        )
    if val_split is not None and val_split not in names:
        raise ConfigError(
            f"data.val_split={val_split!r} is not allowed; the dataset's splits are: "
            f"{', '.join(names)} (or null: no validation)"
        )
    return loaded[split], (loaded[val_split] if val_split is not None else None)


def check_columns(dataset: Any, wanted: dict[str, str | None]) -> None:
    """Each `data.<key>` column must exist: one line listing the ones present."""
    present = list(dataset.column_names)
    for key, column in wanted.items():
        if column is not None and column not in present:
            raise ConfigError(
                f"data.{key}={column!r} is not allowed; the dataset's columns are: "
                f"{', '.join(present)}"
            )


def check_kinds(dataset: Any, image_column: str, label_column: str) -> None:
    """Encoded images in the image column, integers in the label column: one line otherwise."""
    from datasets import ClassLabel, Image, Value

    image, label = dataset.features[image_column], dataset.features[label_column]
    if not isinstance(image, Image):
        raise ConfigError(
            f"data.image_column={image_column!r} is not allowed; it holds {image}, expected "
            "encoded images (datasets.Image)"
        )
    if not (isinstance(label, ClassLabel) or (isinstance(label, Value) and "int" in label.dtype)):
        raise ConfigError(
            f"data.label_column={label_column!r} is not allowed; it holds {label}, expected "
            "integer labels (a ClassLabel or an integer Value)"
        )


def class_names(dataset: Any, label_column: str) -> list[str] | None:
    feature = dataset.features[label_column]
    return list(feature.names) if hasattr(feature, "names") else None


class HFImages(Dataset):
    """(uint8 image of the training size, label) per row of a Hugging Face dataset."""

    def __init__(
        self,
        rows: Any,
        image_column: str,
        label_column: str,
        decoder: ImageDecoder,
        transform: Any,
        device_transforms: dict[str, Any] | None,
        gears: dict[str, Any],
    ) -> None:
        from datasets import Image

        # bytes, not PIL images: the decoders of data/decode.py decode them in the workers
        self.rows = rows.select_columns([image_column, label_column]).cast_column(
            image_column, Image(decode=False)
        )
        self.image_column, self.label_column = image_column, label_column
        self.decoder, self.size = decoder, decoder.size
        self.transform, self.device_transforms, self.gears = transform, device_transforms, gears

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        row = self.rows[int(index)]
        return self.sample(index, row[self.image_column], row[self.label_column])

    def sample(self, index: int, image: dict, label: int) -> tuple[torch.Tensor, int]:
        """Row `index`'s image ({"bytes", "path"}, as datasets stores it) decoded, its label."""
        where = f"row {index}"
        try:
            data = image["bytes"]
            if data is None:  # a path-only image: the file it names
                where = image["path"]
                with open(where, "rb") as handle:
                    data = handle.read()
        except (OSError, TypeError, KeyError) as error:
            raise UnreadableImage(f"cannot decode image {where}: {error}") from None
        pixels = centre_square(self.decoder.decode(where, data), self.size)
        return (pixels if self.transform is None else self.transform(pixels)), int(label)


class HFStream(Stream):
    """`data.streaming=true`: the rows as a stream of pieces (`PIECE_ROWS` consecutive rows
    each; data/streams.py deals them to ranks and workers and keeps the position):
    `read(piece, offset)` slices the memory-mapped Arrow table from that row on and reads it
    in order, `READ_ROWS` at a time, so a resume starts where it stopped without reading the
    rows before.

    Why not datasets' own IterableDataset (`to_iterable_dataset`, `split_dataset_by_node`):
    its `state_dict` is one per rank and worker, valid only for the same number of both,
    and `split_dataset_by_node` hands out whole files or every n-th row, while the
    template's position is one global list of the epoch's remaining samples that a resumed
    run re-splits over whatever ranks and workers it has.
    """

    shuffle_block = 1024

    def __init__(self, images: HFImages) -> None:
        self.images = images
        self.device_transforms, self.gears = images.device_transforms, images.gears

    def piece_lengths(self) -> list[int]:
        rows = len(self.images)
        return [min(PIECE_ROWS, rows - start) for start in range(0, rows, PIECE_ROWS)]

    def read(self, piece: int, offset: int) -> Iterator[tuple[torch.Tensor, int]]:
        images = self.images
        start = piece * PIECE_ROWS
        end = min(start + PIECE_ROWS, len(images))
        for first in range(start + offset, end, READ_ROWS):
            rows = images.rows[first : min(first + READ_ROWS, end)]  # one Arrow slice
            pairs = zip(rows[images.image_column], rows[images.label_column], strict=True)
            for n, (image, label) in enumerate(pairs):
                yield images.sample(first + n, image, label)


def _decoder_for(data: SimpleNamespace, rows: Any, column: str) -> tuple[ImageDecoder, str]:
    """`data.decoder`; auto's rule reads the sizes of a few images, written to scratch files."""
    import tempfile

    if data.decoder != "auto":
        return choose_decoder(data.decoder, [], data.channels, data.image_size)
    from datasets import Image

    sample = rows.select_columns([column]).cast_column(column, Image(decode=False))
    picks = np.linspace(0, len(sample) - 1, num=min(16, len(sample))).astype(int).tolist()
    with tempfile.TemporaryDirectory() as scratch:
        paths = []
        for n, i in enumerate(picks):
            image = sample[i][column]
            if image["bytes"] is None:
                paths.append(image["path"])
                continue
            (Path(scratch) / f"{n}.img").write_bytes(image["bytes"])
            paths.append(str(Path(scratch) / f"{n}.img"))
        return choose_decoder("auto", paths, data.channels, data.image_size)


def hf(
    num_classes: int,
    path: str | None = None,
    name: str | None = None,
    split: str = "train",
    val_split: str | None = "auto",
    image_column: str = "image",
    label_column: str = "label",
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
) -> tuple[HFImages | HFStream, HFImages | HFStream | None]:
    """`data=hf`: image classification from a Hugging Face dataset, rows by index
    (`HFImages`), or with `streaming` read in order as a stream of pieces (`HFStream`)."""
    data = SimpleNamespace(**locals())
    train_rows, val_rows = splits(load(path, name), split, val_split)
    columns = {"image_column": image_column, "label_column": label_column}
    for rows in (train_rows, val_rows):
        if rows is not None:
            check_columns(rows, columns)
    check_kinds(train_rows, image_column, label_column)
    names = class_names(train_rows, label_column)
    if names is not None and len(names) != num_classes:
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise ConfigError(
            f"data.num_classes={num_classes} is not allowed; the label column "
            f"{label_column!r} has {len(names)} classes ({shown}); set data.num_classes={len(names)}"
        )
    for rows in (train_rows, val_rows):
        labels = np.asarray(rows[label_column]) if rows is not None and len(rows) else None
        if labels is not None and (labels.min() < 0 or labels.max() >= num_classes):
            raise ConfigError(
                f"data.num_classes={num_classes} is not allowed; the label column "
                f"{label_column!r} holds labels {int(labels.min())}..{int(labels.max())}: "
                f"expected 0..{num_classes - 1}"
            )
    chosen, reason = _decoder_for(data, train_rows, image_column)
    gears = {"data_batch_dtype": batch_dtype, "decoder": chosen.name, "decoder_reason": reason}
    sets = []
    for rows, limit, train in ((train_rows, num_samples, True), (val_rows, num_val_samples, False)):
        if rows is None or limit == 0:
            sets.append(None)
            continue
        keep = take(len(rows), limit, split_seed)
        if keep is not None:
            rows = rows.select(keep)
        sets.append(
            HFImages(
                rows,
                image_column,
                label_column,
                chosen,
                host_transform(data, train),
                device_stage(data),
                gears,
            )
        )
    log.info(
        "data: %d training and %d validation rows from %s",
        len(sets[0]), len(sets[1]) if sets[1] is not None else 0, path or name,
    )  # fmt: skip
    if streaming:
        return HFStream(sets[0]), (HFStream(sets[1]) if sets[1] is not None else None)
    return sets[0], sets[1]
