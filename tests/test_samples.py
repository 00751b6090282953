"""Any sample structure: dict and nested samples collate, reach the device in the model's
layout and are read by the built-in tasks by their Hugging Face-style field names; a sample
a task cannot read is one line. (The "Make it yours" example of docs/make-it-yours.md, whose samples are
dicts, trains through the CLI with gears, DDP, batch_size=auto and a resume in
tests/test_make_it_yours.py.)"""

from __future__ import annotations

import pytest
import torch
from helpers import make_cfg
from torch.utils.data import DataLoader, Dataset

from gearshift.config import ConfigError
from gearshift.data.loading import to_device
from gearshift.data.sources import FieldReader
from gearshift.tasks import Classification, LanguageModel, Regression
from train import fit

CPU = torch.device("cpu")


class HFStyle(Dataset):
    """Samples as a Hugging Face image dataset gives them, with a nested extra field."""

    def __init__(self, n: int, image: str = "pixel_values") -> None:
        self.n, self.image = n, image

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i)
        pixels = torch.randint(0, 256, (3, 8, 8), dtype=torch.uint8, generator=g)
        return {self.image: pixels, "label": i % 4, "meta": {"id": i, "name": f"s{i}"}}


def hf_source(num_samples: int, num_val_samples: int, image: str = "pixel_values", **_):
    return HFStyle(num_samples, image), HFStyle(num_val_samples, image)


def collated(dataset: Dataset, n: int) -> dict:
    return next(iter(DataLoader(dataset, batch_size=n)))


def test_dict_batches_collate_and_every_tensor_moves_in_the_models_layout():
    batch = collated(HFStyle(4), 4)
    placed = to_device(batch, CPU, False, torch.channels_last)
    assert placed["pixel_values"].is_contiguous(memory_format=torch.channels_last)
    assert placed["pixel_values"].dtype == torch.uint8  # the uint8 path: bytes, scaled later
    assert placed["meta"]["id"].tolist() == [0, 1, 2, 3] and placed["meta"]["name"][3] == "s3"
    inputs, targets = Classification(4, (3, 8, 8)).split(placed)
    assert inputs is placed["pixel_values"] and targets.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("image", ["pixel_values", "image"])
def test_the_image_tasks_read_hugging_face_fields(image):
    batch = collated(HFStyle(2, image), 2)
    for task in (Classification(4, (3, 8, 8)), Regression(1, (3, 8, 8))):
        inputs, targets = task.split(batch)
        assert torch.equal(inputs, batch[image]) and torch.equal(targets, batch["label"])


def test_the_language_model_shifts_input_ids_and_labels_to_next_token_pairs():
    ids = torch.arange(10).view(2, 5)
    task = LanguageModel(vocab_size=16, block_size=4)
    inputs, targets = task.split({"input_ids": ids, "attention_mask": ids * 0})
    assert inputs.tolist() == [[0, 1, 2, 3], [5, 6, 7, 8]]
    assert targets.tolist() == [[1, 2, 3, 4], [6, 7, 8, 9]]
    labels = ids.masked_fill(ids % 5 == 2, -100)  # positions without a loss
    _, targets = task.split({"input_ids": ids, "labels": labels})
    assert targets.tolist() == [[1, -100, 3, 4], [6, -100, 8, 9]]


def test_data_fields_name_the_fields_and_pairs_read_as_they_are():
    task = Regression(1, (2,))
    FieldReader(task, {"inputs": "noisy", "targets": "clean"})  # the names task.split reads
    reader = task.split
    x, y = torch.zeros(2, 2), torch.ones(2, 1)
    assert reader({"clean": y, "noisy": x, "other": 1}) == (x, y)
    pair = ((x, {"extra": y}), y)  # nested inputs pass through to the task untouched
    assert reader(pair) == pair


def test_a_sample_the_task_cannot_read_is_one_line_naming_both_sides():
    task = Classification(4, (3, 8, 8))
    with pytest.raises(ConfigError) as error:
        FieldReader(task).check(HFStyle(2, image="pixels"))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(
        "task._target_='gearshift.tasks.classification.Classification' cannot read the "
        "samples: their fields are pixels, label, meta; it reads inputs from one of: inputs, "
        "pixel_values, image, img, x; targets from one of: targets, label, labels, fine_label, y"
    )
    with pytest.raises(ConfigError, match=r"^data.fields=\{'targets': 'y'\} is not allowed; the samples' fields are pixel_values, label, meta; expected inputs"):  # fmt: skip
        FieldReader(task, {"targets": "y"}).check(HFStyle(2))
    with pytest.raises(ConfigError, match=r"^data.fields=\{'input': 'x'\} is not allowed; expected the keys inputs and targets"):  # fmt: skip
        FieldReader(task, {"input": "x"})


def test_a_dict_sample_dataset_trains_with_workers_accumulation_and_the_uint8_path(tmp_path):
    cfg = make_cfg(
        "model=mlp", "data.image_size=8", f"data._target_={__name__}.hf_source",
        "data.num_samples=64", "data.num_val_samples=16", "data.on_device=false",
        "dataloader=tuned", "dataloader.num_workers=2", "accum=2", "max_steps=3",
        "memory_format=channels_last", "device_transforms.normalize=true",
        "data.num_classes=4",
    )  # fmt: skip
    summary = fit(cfg, tmp_path).summary
    assert summary["steps"] == 3 and summary["samples"] == 3 * 2 * 16
    assert summary["gears"]["num_workers"] == 2 and summary["val_accuracy"] is not None
