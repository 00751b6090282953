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
names count the classes). Which columns: `data.fields.inputs` / `data.fields.targets`,
else the task's field names tried in order (`image`, `img`, ... and `label`, `fine_label`,
...), as for dict samples of any source (data/sources.py). A column the config names that
the dataset lacks stops the run at start with one line listing the columns it has; an
unreadable Parquet file, or an image that does not decode, is named with its file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
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


Files = dict[str, tuple[tuple[str, str], ...]]  # split -> (file as shown, its path), in row order


def load(path: str | None, name: str | None) -> tuple[Any, Files]:
    """The Dataset or DatasetDict at `path` (a save_to_disk folder, a folder of data files,
    one data file) or, by `name`, from the local cache; and the files each split's rows
    come from, where known (named in the message of a row that does not decode)."""
    datasets = _datasets()
    if (path is None) == (name is None):
        raise ConfigError(
            f"data.path={path!r} is not allowed; data=hf reads either data.path (a folder "
            "or data files) or data.name (a dataset in the local cache): set one of them"
        )
    if name is not None:
        return _load_cached(datasets, name), {}
    where = Path(path).expanduser()
    if not where.exists():
        raise ConfigError(f"data.path={path!r} is not allowed; no such file or folder")
    if where.is_dir() and any((where / f).is_file() for f in ("dataset_dict.json", "state.json")):
        loaded = datasets.load_from_disk(str(where))
        parts = loaded if hasattr(loaded, "keys") else {"train": loaded}
        return loaded, {
            split: tuple((_shown(c["filename"], where), c["filename"]) for c in rows.cache_files)
            for split, rows in parts.items()
        }
    if where.is_file():
        kind = where.suffix.lower().lstrip(".").replace("jsonl", "json")
        if "." + kind not in DATA_FILES:
            raise ConfigError(
                f"data.path={path!r} is not allowed; expected a save_to_disk folder, a folder "
                f"of data files or one file ({', '.join(DATA_FILES)})"
            )
        builder = datasets.load_dataset_builder(kind, data_files={"train": str(where)})
    elif not any(p.suffix.lower() in DATA_FILES for p in where.rglob("*")):
        raise ConfigError(
            f"data.path={path!r} is not allowed; the folder holds no save_to_disk dataset "
            f"(dataset_dict.json or state.json) and no data files ({', '.join(DATA_FILES)})"
        )
    else:
        builder = datasets.load_dataset_builder(str(where))
    return _prepared(builder, where, path)


def _load_cached(datasets: Any, name: str) -> Any:
    """data.name: the dataset from the local Hugging Face cache, never the network."""
    try:
        with _offline(datasets):
            return datasets.load_dataset(name)
    except Exception as error:  # the Hub client raises many kinds; all mean "not cached"
        raise ConfigError(
            f"data.name={name!r} is not allowed; it is not in the local Hugging Face "
            f"cache ({type(error).__name__}: {str(error).splitlines()[0][:200]}); "
            "download it once with internet, or point data.path at its files"
        ) from None


def _prepared(builder: Any, where: Path, path: str) -> tuple[Any, Files]:
    """The builder's dataset, prepared as load_dataset prepares it, with the files it resolved
    kept: a Parquet file is read (its footer) before the copy to Arrow, so a damaged one is
    named."""
    files = {
        str(split): tuple((_shown(f, where), f.removeprefix("file://")) for f in names)
        for split, names in builder.config.data_files.items()
    }
    for names in files.values():
        for _, file in names:
            _parquet_rows(file, path)
    try:
        builder.download_and_prepare()
    except Exception as error:  # pyarrow's and datasets' errors of a file that does not read
        for names in builder.config.data_files.values():
            for file in names:
                _parquet_rows(file.removeprefix("file://"), path, read=True)  # raises, named
        raise ConfigError(
            f"data.path={path!r} is not allowed; datasets could not read its files "
            f"({type(error).__name__}: {str(error).splitlines()[0][:200]})"
        ) from None
    counted = (".parquet", ".arrow")  # the kinds whose rows RowOrigin can count
    return builder.as_dataset(), {
        s: f for s, f in files.items() if all(file.lower().endswith(counted) for _, file in f)
    }


def _shown(file: str, where: Path) -> str:
    """A data file as the messages name it: relative to data.path's folder."""
    folder = where if where.is_dir() else where.parent
    file = file.removeprefix("file://")
    return os.path.relpath(file, folder) if file.startswith(str(folder)) else file


def _parquet_rows(file: str, path: str, read: bool = False) -> int:
    """Rows of a Parquet file from its footer (-1 for other kinds); with `read`, every row
    group read too. One line naming the file if it does not read."""
    if not file.lower().endswith(".parquet"):
        return -1
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(file)
        for group in range(parquet.num_row_groups if read else 0):
            parquet.read_row_group(group)
        return parquet.metadata.num_rows
    except Exception as error:  # ArrowInvalid, OSError: the file is not what it says
        raise ConfigError(
            f"data.path={path!r} is not allowed; {file} is not a "
            f"readable Parquet file ({type(error).__name__}: {str(error).splitlines()[0][:200]})"
        ) from None


def _rows_in(file: str) -> int:
    """Rows of a Parquet file (its footer) or of an Arrow stream file (save_to_disk's;
    memory-mapped, no rows copied); counted only for a message, never at start."""
    if file.lower().endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.ParquetFile(file).metadata.num_rows
    import pyarrow as pa

    with pa.memory_map(file) as source:
        return pa.ipc.open_stream(source).read_all().num_rows


@dataclass(frozen=True)
class RowOrigin:
    """Where a row of the dataset came from: its split, and the file and row in the file
    where the split's files are known; `keep` maps a row of a subset to its split's."""

    split: str
    files: tuple[tuple[str, str], ...] = ()  # (as shown, path), in the rows' order
    keep: tuple[int, ...] | None = None

    def __call__(self, index: int) -> str:
        row = self.keep[index] if self.keep is not None else index
        place, first = f"row {row} of split {self.split!r}", 0
        for shown, file in self.files:
            count = _rows_in(file)
            if row < first + count:
                return f"{place} ({shown}, its row {row - first})"
            first += count
        return place


def splits(loaded: Any, split: str, val_split: str | None) -> tuple[Any, Any | None]:
    """(train, validation or None) of a Dataset or DatasetDict; a missing split is named.
    `val_split="auto"`: "validation", "valid", "val" or "test", the first present (or none)."""
    if not hasattr(loaded, "keys"):  # one Dataset: training only
        return loaded, None
    names, val_split = list(loaded.keys()), val_split_name(loaded, split, val_split)
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


def val_split_name(loaded: Any, split: str, val_split: str | None) -> str | None:
    """`val_split`, or for "auto" the first of the usual names present, in the order
    datasets' builders use them (None: no validation)."""
    if val_split != "auto":
        return val_split
    names = list(loaded.keys()) if hasattr(loaded, "keys") else []
    return next((n for n in VAL_SPLITS if n in names and n != split), None)


def check_columns(dataset: Any, wanted: dict[str, str | None]) -> None:
    """Each `data.<key>` column must exist: one line listing the ones present."""
    present = list(dataset.column_names)
    for key, column in wanted.items():
        if column is not None and column not in present:
            raise ConfigError(
                f"data.{key}={column!r} is not allowed; the dataset's columns are: "
                f"{', '.join(present)}"
            )


DEFAULT_FIELDS = {"inputs": "image", "targets": "label"}  # hf() called on its own


def choose_columns(dataset: Any, fields: Mapping[str, str | Sequence[str]]) -> tuple[str, str]:
    """(image column, label column): a name `data.fields` gives, or the first present of
    the task's names; one line if none is, or a column holds the wrong kind."""
    from datasets import ClassLabel, Image, Value

    present = list(dataset.column_names)
    chosen = []
    for key, kind in (("inputs", "encoded images"), ("targets", "integer labels")):
        names = fields[key]
        if isinstance(names, str):
            check_columns(dataset, {f"fields.{key}": names})
            chosen.append(names)
            continue
        found = next((n for n in names if n in present), None)
        if found is None:
            raise ConfigError(
                f"data.fields.{key}=null is not allowed; the dataset has none of the columns "
                f"the task reads as {key} ({', '.join(names)}); its columns are: "
                f"{', '.join(present)}; name the one of {kind}: data.fields.{key}=NAME"
            )
        chosen.append(found)
    image, label = chosen
    if not isinstance(dataset.features[image], Image):
        raise ConfigError(
            f"data.fields.inputs={image!r} is not allowed; it holds {dataset.features[image]}, "
            "expected encoded images (datasets.Image)"
        )
    feature = dataset.features[label]
    if not (isinstance(feature, ClassLabel) or (isinstance(feature, Value) and "int" in feature.dtype)):  # fmt: skip
        raise ConfigError(
            f"data.fields.targets={label!r} is not allowed; it holds {feature}, expected "
            "integer labels (a ClassLabel or an integer Value)"
        )
    return image, label


def check_labels(sets: Sequence[Any], label: str, num_classes: int) -> None:
    """A ClassLabel's names count `num_classes`; every label is in 0..num_classes-1."""
    names = getattr(sets[0].features[label], "names", None)
    if names is not None and len(names) != num_classes:
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise ConfigError(
            f"data.num_classes={num_classes} is not allowed; the label column "
            f"{label!r} has {len(names)} classes ({shown}); set data.num_classes={len(names)}"
        )
    for rows in sets:
        labels = np.asarray(rows[label]) if rows is not None and len(rows) else None
        if labels is not None and (labels.min() < 0 or labels.max() >= num_classes):
            raise ConfigError(
                f"data.num_classes={num_classes} is not allowed; the label column "
                f"{label!r} holds labels {int(labels.min())}..{int(labels.max())}: "
                f"expected 0..{num_classes - 1}"
            )


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
        origin: RowOrigin | None = None,
    ) -> None:
        from datasets import Image

        # bytes, not PIL images: the decoders of data/decode.py decode them in the workers
        self.rows = rows.select_columns([image_column, label_column]).cast_column(
            image_column, Image(decode=False)
        )
        self.image_column, self.label_column = image_column, label_column
        self.decoder, self.size = decoder, decoder.size
        self.transform, self.device_transforms, self.gears = transform, device_transforms, gears
        self.origin = origin or RowOrigin("train")

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        row = self.rows[int(index)]
        return self.sample(index, row[self.image_column], row[self.label_column])

    def sample(self, index: int, image: dict, label: int) -> tuple[torch.Tensor, int]:
        """Row `index`'s image ({"bytes", "path"}, as datasets stores it) decoded, its label."""
        where = row = f"row {index}"  # its split, file and row there: worked out on an error
        try:
            data = image["bytes"]
            if data is None:  # a path-only image: the file it names
                where = image["path"]
                with open(where, "rb") as handle:
                    data = handle.read()
            pixels = centre_square(self.decoder.decode(where, data), self.size)
        except (OSError, TypeError, KeyError, UnreadableImage) as error:
            why = str(error).removeprefix(f"cannot decode image {where}: ")
            named = self.origin(index) if where == row else where
            raise UnreadableImage(f"cannot decode image {named}: {why}") from None
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
    fields: Mapping[str, str | Sequence[str]] | None = None,
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
    (`HFImages`), or with `streaming` read in order as a stream of pieces (`HFStream`).
    `fields`: per key (inputs, targets) the column, or the names to try in order."""
    data = SimpleNamespace(**locals())
    loaded, files = load(path, name)
    val_name = val_split_name(loaded, split, val_split)
    train_rows, val_rows = splits(loaded, split, val_name)
    image, label = choose_columns(train_rows, {**DEFAULT_FIELDS, **(fields or {})})
    if val_rows is not None:
        check_columns(val_rows, {"fields.inputs": image, "fields.targets": label})
    check_labels([train_rows, val_rows], label, num_classes)
    chosen, reason = _decoder_for(data, train_rows, image)
    gears = {"data_batch_dtype": batch_dtype, "decoder": chosen.name, "decoder_reason": reason}
    sets = []
    for rows, limit, train, which in (
        (train_rows, num_samples, True, split), (val_rows, num_val_samples, False, val_name)
    ):  # fmt: skip
        if rows is None or limit == 0:
            sets.append(None)
            continue
        keep = take(len(rows), limit, split_seed)
        origin = RowOrigin(which, files.get(which, ()), None if keep is None else tuple(keep))
        rows = rows if keep is None else rows.select(keep)
        transform = host_transform(data, train)
        sets.append(
            HFImages(rows, image, label, chosen, transform, device_stage(data), gears, origin)
        )
    log.info(
        "data: %d training and %d validation rows from %s (images %r, labels %r)",
        len(sets[0]), len(sets[1]) if sets[1] is not None else 0, path or name, image, label,
    )  # fmt: skip
    if streaming:
        return HFStream(sets[0]), (HFStream(sets[1]) if sets[1] is not None else None)
    return sets[0], sets[1]
