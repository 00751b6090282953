"""data=hf: Hugging Face datasets the tests write (save_to_disk, Parquet) train through the
template's loader, decode like data=imagefolder, resume exactly, and name what is missing."""

from __future__ import annotations

import io
import json
from functools import partial

import datasets
import numpy as np
import pytest
import torch
from datasets import ClassLabel, Dataset, DatasetDict, Features, Value
from datasets import Image as ImageFeature
from helpers import load_script, make_cfg, run_train
from PIL import Image
from test_checkpoint import assert_a_stream_or_index_source_resumes_exactly
from test_datasets import CPU
from test_images_uint8 import photo

from gearshift.config import ConfigError, check_config
from gearshift.data.decode import ImageDecoder, centre_square
from gearshift.data.loading import build_data
from gearshift.data.text import tokenizer_from_meta
from gearshift.trainer import fit

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
    train, val = build_data(cfg, CPU)
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
        ("data.image_column=img", "data.image_column='img' is not allowed; the dataset's columns are: image, label, caption"),
        ("data.label_column=y", "data.label_column='y' is not allowed; the dataset's columns are: image, label, caption"),
        ("data.image_column=caption", "data.image_column='caption' is not allowed; it holds Value('string'), expected encoded images (datasets.Image)"),
        ("data.label_column=caption", "data.label_column='caption' is not allowed; it holds Value('string'), expected integer labels (a ClassLabel or an integer Value)"),
        ("data.split=training", "data.split='training' is not allowed; the dataset's splits are: train, validation"),
        ("data.val_split=test", "data.val_split='test' is not allowed; the dataset's splits are: train, validation (or null: no validation)"),
        ("data.num_classes=4", "data.num_classes=4 is not allowed; the label column 'label' has 3 classes (red, green, blue); set data.num_classes=3"),
    ],
)  # fmt: skip
def test_what_the_dataset_lacks_is_named_with_what_it_has(tmp_path, override, message):
    cfg = hf_cfg(write_hf(tmp_path, "disk"), override)
    check_config(cfg)
    with pytest.raises(ConfigError) as error:
        build_data(cfg, CPU)
    assert str(error.value) == message


@pytest.mark.slow  # 20 s; the message is the test above's, the exit path test_datasets.py's
def test_a_missing_column_is_one_error_line_exit_2_and_no_run_folder(tmp_path):
    path = write_hf(tmp_path, "parquet")
    (tmp_path / "work").mkdir()
    result = run_train(
        "data=hf", f"data.path={path}", "data.num_classes=3", "data.image_column=pixels",
        "logger=none", cwd=tmp_path / "work",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == [
        "error: data.image_column='pixels' is not allowed; the dataset's columns are: "
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
    train, val = build_data(cfg, CPU)
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
        build_data(hf_cfg(tmp_path / "empty"), CPU)
    cfg = hf_cfg(tmp_path, "data.path=null", "data.name=someone/not-cached")
    check_config(cfg)
    with pytest.raises(ConfigError) as error:  # offline: the cache or nothing
        build_data(cfg, CPU)
    assert str(error.value).startswith(
        "data.name='someone/not-cached' is not allowed; it is not in the local Hugging Face cache"
    ) and "\n" not in str(error.value)


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
    images = build_data(hf_cfg(write_hf(tmp_path, "disk"), "data.decoder=pil"), CPU)[0]
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
