"""data=hf: Hugging Face datasets the tests write (save_to_disk, Parquet) train through the
template's loader, decode like data=imagefolder, resume exactly, and name what is missing."""

from __future__ import annotations

import io
import json
from functools import partial
from types import SimpleNamespace

import datasets
import numpy as np
import pytest
import torch
from datasets import ClassLabel, Dataset, DatasetDict, Features, Value
from datasets import Image as ImageFeature
from helpers import ROOT, load_script, make_cfg, run_train, train_in_process
from PIL import Image
from test_checkpoint import assert_a_stream_or_index_source_resumes_exactly
from test_datasets import CPU
from test_images_uint8 import assert_every_row_ends_with_the_recipes_kind_of_batch, photo

from gearshift.build import build_parts
from gearshift.config import ConfigError, check_config
from gearshift.data.decode import ImageDecoder, centre_square
from gearshift.data.text import tokenizer_from_meta
from gearshift.data_batches import data_batches
from gearshift.parallel.distributed import Ranks
from train import fit

CLASSES = ["red", "green", "blue"]


@pytest.fixture(autouse=True)
def _datasets_cache(tmp_path, monkeypatch):
    """The Arrow copies load_dataset makes of Parquet files go under the test's folder."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # for train.py subprocesses


def jpeg(k: int, i: int) -> bytes:
    pixels = photo(40, 52, seed=10 * k + i)
    pixels[..., k] = np.maximum(pixels[..., k], 160)  # the class shows in one channel
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


def image_rows(per_class: int, offset: int = 0) -> Dataset:
    rows = [(k, i) for i in range(offset, offset + per_class) for k in range(3)]
    features = Features(
        {"image": ImageFeature(), "label": ClassLabel(names=CLASSES), "caption": Value("string")}
    )
    return Dataset.from_dict(
        {
            "image": [{"bytes": jpeg(k, i), "path": None} for k, i in rows],
            "label": [k for k, _ in rows],
            "caption": [f"{CLASSES[k]} picture {i}" for k, i in rows],
        },
        features=features,
    )


def write_hf(tmp_path, kind: str):
    """The same 21 training and 3 validation rows as a save_to_disk folder or Parquet files."""
    train, val = image_rows(7), image_rows(1, offset=7)
    if kind == "disk":
        DatasetDict({"train": train, "validation": val}).save_to_disk(tmp_path / "disk")
        return tmp_path / "disk"
    (tmp_path / "parquet").mkdir()
    train.to_parquet(tmp_path / "parquet/train-00000-of-00001.parquet")
    val.to_parquet(tmp_path / "parquet/validation-00000-of-00001.parquet")
    return tmp_path / "parquet"


def hf_cfg(path, *overrides: str):
    return make_cfg(
        "data=hf", f"data.path={path}", "data.num_classes=3", "data.image_size=16",
        "data.num_samples=null", "data.num_val_samples=null", "batch_size=8", *overrides,
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["disk", "parquet"])
def test_rows_become_the_decoded_images_and_labels_of_the_rows(tmp_path, kind):
    path = write_hf(tmp_path, kind)
    cfg = hf_cfg(path, "data.decoder=pil")  # uint8 batches: the decoded pixels as they are
    train, val = data_batches(cfg, CPU)
    assert len(val.loader.dataset) == 3
    decoder = ImageDecoder("pil", 3, 16)
    dataset = train.loader.dataset
    for index in (0, 5, 20):
        image, label = dataset[index]
        k, i = index % 3, index // 3
        expected = centre_square(decoder.decode("x", jpeg(k, i)), 16)
        assert label == k and image.dtype == torch.uint8 and torch.equal(image, expected)


def test_hf_trains_from_the_command_line(tmp_path):
    path = write_hf(tmp_path, "parquet")
    (tmp_path / "work").mkdir()
    result = run_train(
        "data=hf", f"data.path={path}", "data.num_classes=3", "data.image_size=16",
        "model=simple_cnn", "batch_size=4", "max_steps=3", "dataloader.num_workers=2",
        "logger=none", "progress_bar=false", cwd=tmp_path / "work",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(next((tmp_path / "work").rglob("summary.json")).read_text())
    assert summary["steps"] == 3 and summary["gears"]["decoder"]


@pytest.mark.parametrize("streaming", [False, True], ids=["by-index", "streaming"])
def test_stop_mid_epoch_then_resume_equals_an_uninterrupted_run(tmp_path, streaming):
    path = write_hf(tmp_path, "disk")  # 21 to train: 3 batches an epoch
    assert_a_stream_or_index_source_resumes_exactly(partial(hf_cfg, path), tmp_path, streaming)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.fields.inputs=img", "data.fields.inputs='img' is not allowed; the dataset's columns are: image, label, caption"),
        ("data.fields.targets=y", "data.fields.targets='y' is not allowed; the dataset's columns are: image, label, caption"),
        ("data.fields.inputs=caption", "data.fields.inputs='caption' is not allowed; it holds Value('string'), expected encoded images (datasets.Image)"),
        ("data.fields.targets=caption", "data.fields.targets='caption' is not allowed; it holds Value('string'), expected integer labels (a ClassLabel or an integer Value)"),
        ("data.split=training", "data.split='training' is not allowed; the dataset's splits are: train, validation"),
        ("data.val_split=test", "data.val_split='test' is not allowed; the dataset's splits are: train, validation (or null: no validation)"),
        ("data.num_classes=4", "data.num_classes=4 is not allowed; the label column 'label' has 3 classes (red, green, blue); set data.num_classes=3"),
    ],
)  # fmt: skip
def test_what_the_dataset_lacks_is_named_with_what_it_has(tmp_path, override, message):
    cfg = hf_cfg(write_hf(tmp_path, "disk"), override)
    check_config(cfg)
    with pytest.raises(ConfigError) as error:
        data_batches(cfg, CPU)
    assert str(error.value) == message


@pytest.mark.slow  # 20 s; the message is the test above's, the exit path test_datasets.py's
def test_a_missing_column_is_one_error_line_exit_2_and_no_run_folder(tmp_path):
    path = write_hf(tmp_path, "parquet")
    (tmp_path / "work").mkdir()
    result = run_train(
        "data=hf", f"data.path={path}", "data.num_classes=3", "data.fields.inputs=pixels",
        "logger=none", cwd=tmp_path / "work",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == [
        "error: data.fields.inputs='pixels' is not allowed; the dataset's columns are: "
        "image, label, caption"
    ], result.stderr
    assert list((tmp_path / "work").iterdir()) == []


def test_a_dataset_in_the_local_cache_is_read_by_name_offline(tmp_path):
    """As `datasets` leaves a Hub dataset it downloaded: <cache>/me___tiny/default/0.0.0/<hash>/
    (here the Arrow files of the Parquet files, renamed as the Hub dataset's would be)."""
    path = write_hf(tmp_path, "parquet")
    datasets.load_dataset(str(path))  # Arrow files in the cache, as a download leaves them
    cache = datasets.config.HF_DATASETS_CACHE
    built = next(p for p in cache.glob("parquet/*/*/*") if p.is_dir())
    cached = cache / "me___tiny" / "default" / "0.0.0" / built.name
    cached.mkdir(parents=True)
    for file in built.iterdir():
        (cached / file.name.replace("parquet-", "tiny-")).write_bytes(file.read_bytes())
    cfg = hf_cfg(tmp_path, "data.path=null", "data.name=me/tiny", "data.decoder=pil")
    check_config(cfg)
    train, val = data_batches(cfg, CPU)
    assert len(train.loader.dataset) == 21 and len(val.loader.dataset) == 3
    image, label = train.loader.dataset[4]
    expected = centre_square(ImageDecoder("pil", 3, 16).decode("x", jpeg(1, 1)), 16)
    assert label == 1 and torch.equal(image, expected)  # row 4: class 1, image 1


def test_where_to_read_from_is_checked_at_start(tmp_path):
    with pytest.raises(ConfigError, match=r"data=hf reads either data\.path"):
        check_config(make_cfg("data=hf"))
    with pytest.raises(ConfigError, match="no such file or folder"):
        check_config(make_cfg("data=hf", f"data.path={tmp_path / 'nothing'}"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no save_to_disk dataset"):
        data_batches(hf_cfg(tmp_path / "empty"), CPU)
    cfg = hf_cfg(tmp_path, "data.path=null", "data.name=someone/not-cached")
    check_config(cfg)
    with pytest.raises(ConfigError) as error:  # offline: the cache or nothing
        data_batches(cfg, CPU)
    assert str(error.value).startswith(
        "data.name='someone/not-cached' is not allowed; it is not in the local Hugging Face cache"
    ) and "\n" not in str(error.value)


def test_a_bad_streaming_value_is_one_line_before_any_run_folder(tmp_path):
    # the command: it trained as if true (tests/test_typed_nodes.py checks the other
    # sources', models' and tasks' keys)
    done = train_in_process(
        "data=hf", "data.path=.", "data.streaming=sometimes", "max_steps=1", cwd=tmp_path
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.splitlines() == [
        "error: data.streaming='sometimes' is not allowed; choose true or false"
    ]
    assert list(tmp_path.iterdir()) == []


def cifar100_like(per_class: int) -> Dataset:
    """CIFAR-100's column names: `img`, `fine_label` (3 classes here) and `coarse_label` (2)."""
    rows = [(k, i) for i in range(per_class) for k in range(3)]
    return Dataset.from_dict(
        {
            "img": [{"bytes": jpeg(k, i), "path": None} for k, i in rows],
            "fine_label": [k for k, _ in rows],
            "coarse_label": [min(k, 1) for k, _ in rows],
        },
        features=Features(
            {
                "img": ImageFeature(),
                "fine_label": ClassLabel(names=CLASSES),
                "coarse_label": ClassLabel(names=["red", "other"]),
            }
        ),
    )


@pytest.mark.parametrize(
    ("overrides", "labels"),
    [
        ((), [0, 1, 2, 0]),  # the task's names, first present: img, fine_label
        (("data.fields={inputs: img, targets: coarse_label}", "data.num_classes=2"), [0, 1, 1, 0]),
        (("data.fields.targets=coarse_label", "data.num_classes=2"), [0, 1, 1, 0]),
    ],
    ids=["task-names", "data.fields", "data.fields.targets"],
)
def test_columns_are_the_tasks_field_names_or_those_data_fields_gives(tmp_path, overrides, labels):
    DatasetDict({"train": cifar100_like(4)}).save_to_disk(tmp_path / "c100")
    cfg = hf_cfg(tmp_path / "c100", "data.decoder=pil", *overrides)
    check_config(cfg)
    dataset = build_parts(cfg, Ranks(), "none", CPU).train_batches.loader.dataset
    assert [dataset[i][1] for i in range(4)] == labels
    image = dataset[4][0]  # row 4: class 1, image 1
    assert torch.equal(image, centre_square(ImageDecoder("pil", 3, 16).decode("x", jpeg(1, 1)), 16))


def test_a_dataset_without_the_tasks_columns_names_them_and_the_key_to_set(tmp_path):
    rows = cifar100_like(1).rename_column("img", "picture")
    DatasetDict({"train": rows}).save_to_disk(tmp_path / "c100")
    with pytest.raises(ConfigError) as error:
        build_parts(hf_cfg(tmp_path / "c100"), Ranks(), "none", CPU)
    assert str(error.value) == (
        "data.fields.inputs=null is not allowed; the dataset has none of the columns the task "
        "reads as inputs (inputs, pixel_values, image, img, x); its columns are: picture, "
        "fine_label, coarse_label; name the one of encoded images: data.fields.inputs=NAME"
    )


def write_parquet_train(tmp_path, damaged_row: int | None = None):
    """21 training rows in two uncompressed Parquet files (12 + 9 rows); `damaged_row`:
    that row's JPEG bytes overwritten in the file, as a disk or a copy damages a file."""
    import pyarrow.parquet as pq

    rows = image_rows(7)
    folder = tmp_path / "parquet"
    folder.mkdir()
    for n, (start, end) in enumerate([(0, 12), (12, 21)]):
        file = folder / f"train-0000{n}-of-00002.parquet"
        pq.write_table(rows.select(range(start, end)).data.table, file, compression="none")
        if damaged_row is not None and start <= damaged_row < end:
            data = file.read_bytes()
            k, i = damaged_row % 3, damaged_row // 3
            at = data.index(jpeg(k, i)) + 400  # past the JPEG's headers: damage in the pixels
            file.write_bytes(data[:at] + bytes(400) + data[at + 400 :])
    return folder


def test_an_image_that_does_not_decode_is_named_by_split_file_and_row(tmp_path):
    folder = write_parquet_train(tmp_path, damaged_row=15)
    train, _ = data_batches(hf_cfg(folder, "data.decoder=pil"), CPU)
    with pytest.raises(Exception) as error:
        train.loader.dataset[15]
    assert str(error.value).startswith(
        "cannot decode image row 15 of split 'train' (train-00001-of-00002.parquet, its row 3): "
    ), str(error.value)
    subset = data_batches(hf_cfg(folder, "data.decoder=pil", "data.num_samples=18"), CPU)[0]
    kept = [i for i in range(18) if subset.loader.dataset.origin(i).startswith("row 15 ")]
    with pytest.raises(
        Exception, match=r"^cannot decode image row 15 of split 'train' \(train-00001"
    ):
        subset.loader.dataset[kept[0]]  # a seeded subset names the row of the split


def test_a_save_to_disk_row_that_does_not_decode_is_named_by_split_and_arrow_file(tmp_path):
    rows = image_rows(1, offset=7).map(lambda r, i: {"image": {"bytes": b"junk" * 8, "path": None}} if i == 1 else {}, with_indices=True)  # fmt: skip
    DatasetDict({"train": image_rows(7), "validation": rows}).save_to_disk(tmp_path / "disk")
    _, val = data_batches(hf_cfg(tmp_path / "disk", "data.decoder=pil"), CPU)
    with pytest.raises(Exception) as error:
        val.loader.dataset[1]
    assert str(error.value) == (
        "cannot decode image row 1 of split 'validation' "
        "(validation/data-00000-of-00001.arrow, its row 1): not an image file PIL can "
        "identify (32 bytes, starting 6a756e6b)"
    )


def test_a_truncated_parquet_file_is_named(tmp_path):
    folder = write_parquet_train(tmp_path)
    second = folder / "train-00001-of-00002.parquet"
    second.write_bytes(second.read_bytes()[: second.stat().st_size // 2])
    with pytest.raises(ConfigError) as error:
        data_batches(hf_cfg(folder), CPU)
    assert str(error.value) == (
        f"data.path='{folder}' is not allowed; {second} is not a readable Parquet file "
        "(ArrowInvalid: Parquet magic bytes not found in footer. Either the file is corrupted "
        "or this is not a parquet file.)"
    ), str(error.value)


def test_bench_data_has_the_hf_row_and_it_ends_with_the_recipes_kind_of_batch(
    tmp_path, monkeypatch
):
    # the rest of scripts/bench_data.py's rows: tests/test_images_uint8.py
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import bench_data

    bench_data.write_folder(tmp_path / "images", 12, 3, (60, 60))
    args = SimpleNamespace(classes=3, size=32, batch=4, workers=0)
    rows = bench_data.configurations(tmp_path / "images", tmp_path / "stage", args, CPU)
    assert "uint8, data=hf (Parquet)" in rows
    compared = {name: rows[name] for name in ("torchvision recipe", "uint8, data=hf (Parquet)")}
    assert_every_row_ends_with_the_recipes_kind_of_batch(bench_data, compared)


# ---------------------------------------------------------------- a text column for task=lm


def test_prepare_text_reads_a_datasets_text_column_into_token_files(tmp_path, capsys):
    prepare_text = load_script("prepare_text")
    captions = [f"the {c} cat sat {i} times" for i in range(40) for c in CLASSES]
    rows = Dataset.from_dict({"caption": captions, "n": list(range(len(captions)))})
    rows.to_parquet(tmp_path / "captions.parquet")
    DatasetDict({"train": rows}).save_to_disk(tmp_path / "disk")
    for source in (tmp_path / "captions.parquet", tmp_path / "disk"):
        out = tmp_path / f"tokens-{source.suffix or 'disk'}"
        assert prepare_text.main([str(source), str(out), "--column", "caption"]) == 0
        meta = json.loads((out / "meta.json").read_text())
        ids = [np.fromfile(out / f"{s}.bin", dtype=meta["dtype"]) for s in ("train", "val")]
        decode = tokenizer_from_meta(meta).decode
        assert decode(ids[0]) + decode(ids[1]) == "\n".join(captions)  # every row, in order
    cfg = make_cfg(
        "experiment=lm", "data=tokens", f"data.path={out}", "data.block_size=16",
        "model.n_layer=1", "model.n_embd=32", "model.n_head=2", "max_steps=2", "batch_size=4",
        "data.num_samples=null", "data.num_val_samples=null", "logger=none",
        "progress_bar=false", tiny=False,
    )  # fmt: skip
    assert fit(cfg, tmp_path / "run").summary["steps"] == 2  # task=lm trains on them
    assert prepare_text.main([str(tmp_path / "disk"), str(tmp_path / "x"), "--column", "text"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: --column='text' is not allowed; the dataset's columns are: caption, n"
    )
    assert prepare_text.main([str(tmp_path / "disk"), str(tmp_path / "x"), "--column", "n"]) == 2
    assert "it holds int, not text" in capsys.readouterr().err


def test_the_stream_reads_any_piece_from_any_row_on_without_the_rows_before(tmp_path, monkeypatch):
    """The piece reader of the stream protocol (data.streaming, once it lands)."""
    from gearshift.data import hf as module

    monkeypatch.setattr(module, "PIECE_ROWS", 8)
    monkeypatch.setattr(module, "READ_ROWS", 3)
    images = data_batches(hf_cfg(write_hf(tmp_path, "disk"), "data.decoder=pil"), CPU)[0]
    images = images.loader.dataset
    stream = module.HFStream(images)
    assert stream.piece_lengths() == [8, 8, 5] and len(stream) == 21
    sliced = []

    class Rows:  # the dataset's rows, recording what is read from them
        def __init__(self, rows):
            self.rows = rows

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, key):
            sliced.append(key)
            return self.rows[key]

    monkeypatch.setattr(images, "rows", Rows(images.rows))
    for piece, length in enumerate(stream.piece_lengths()):
        for offset in range(length):
            sliced.clear()
            got = list(stream.read(piece, offset))
            first = 8 * piece + offset
            assert [label for _, label in got] == [(first + n) % 3 for n in range(length - offset)]
            assert torch.equal(got[0][0], images[first][0])
            assert sliced[0].start == first  # a slice from the offset on: no earlier row read
