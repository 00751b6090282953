"""The data seam (docs/make-it-yours.md, "gearshift's keys of the data node"): a source,
chosen by `data._target_`, takes the node's other keys and returns `(train, validation or
None)`, map-style or streams (data/streams.py); gearshift's keys (`data.on_device`,
`data.stage_to`, `data.fields`: `FieldReader`, which also checks the first sample before
any work) are not passed on as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import Dataset, IterableDataset, default_collate

from gearshift.config import ConfigError
from gearshift.config.instantiate import accepts, instantiate
from gearshift.config.rules import locate
from gearshift.config.targets import TRAINER_KEYS


# What the loaders of map-style data and of streams (data/streams.py, loaded for a stream
# only) both use, kept here where each reaches it.
def worker_seed(seed: int, rank: int, epoch: int) -> int:
    """The seed of the generator a DataLoader draws its workers' base seed from."""
    return ((seed * 1_000_003 + rank) * 1_000_003 + epoch) % 2**63  # manual_seed's range


def stream_length(dataset: Any) -> int | None:
    """Samples in a pass over `dataset`, None where it does not know."""
    try:
        return len(dataset)
    except TypeError:
        return None


def build_datasets(
    data: DictConfig, device: torch.device, fields: Mapping[str, Any] | None = None
) -> tuple[Dataset, Dataset | None]:
    """(train, validation or None) from the data node, on `device` when `data.on_device`.
    `fields`: the names the task reads (`FieldReader.names`), for a source that takes them;
    None: `data.fields` as given."""
    node: dict[str, Any] = OmegaConf.to_container(data, resolve=True)
    on_device, stage_to, chosen = (node.pop(key, None) for key in TRAINER_KEYS["data"])
    source = locate("data._target_", node.get("_target_"))
    extra: dict[str, Any] = {}
    chosen = {k: v for k, v in (chosen or {}).items() if v is not None}
    if accepts(source, "fields", by_name=True) and (fields or chosen):
        extra["fields"] = fields or chosen
    if on_device:
        if not accepts(source, "device"):
            raise ConfigError(
                f"data.on_device=True is not allowed; {node['_target_']} takes no device "
                "argument, so it cannot make its data on the device"
            )
        extra["device"] = device
    if stage_to and accepts(source, "stage_to"):
        extra["stage_to"] = stage_to
    elif stage_to:  # the source stages nothing itself: its data.path folder is staged
        from gearshift.data.staging import stage_path  # data.stage_to only

        extra["path"] = stage_path(node.get("path"), stage_to)
    built = instantiate("data", node, **extra)
    train, val = built if isinstance(built, tuple) else (built, None)
    for dataset in (train, val):
        streamed = isinstance(dataset, IterableDataset)
        if dataset is not None and not streamed and not hasattr(dataset, "__getitem__"):
            raise ConfigError(
                f"data._target_={node['_target_']!r} is not allowed; it returned "
                f"{type(dataset).__name__}, expected datasets, map-style or IterableDataset "
                "(train, val or None)"
            )
    return train, (None if val is None or stream_length(val) == 0 else val)


class FieldReader:
    """`data.fields` given to the task's `split`, and the first sample checked against it."""

    def __init__(self, task: Any, fields: Mapping[str, Any] | None = None) -> None:
        fields = {k: v for k, v in (fields or {}).items() if v is not None}  # None: not set
        if set(fields) - {"inputs", "targets"}:
            raise ConfigError(
                f"data.fields={fields} is not allowed; expected the keys inputs and targets "
                "(the sample's field names for each)"
            )
        self.task, self.chosen = task, fields
        # the task reads by these names from now on (Task.split)
        task.input_fields = _names(fields.get("inputs")) or tuple(task.input_fields)
        task.target_fields = _names(fields.get("targets")) or tuple(task.target_fields)

    @property
    def reads_fields(self) -> bool:
        """Whether the task reads dict samples by name (else it reads its batches itself)."""
        return bool(self.chosen or self.task.input_fields)

    def names(self) -> dict[str, str | tuple[str, ...]]:
        """What a source that picks its own columns (`data=hf`) is told: per key the name
        `data.fields` gives, else the task's names to try in order."""
        return {
            "inputs": self.chosen.get("inputs") or self.task.input_fields,
            "targets": self.chosen.get("targets") or self.task.target_fields,
        }

    def check(self, dataset: Any, task_cfg: Any = ()) -> None:
        """Read the first sample of `dataset` as the task's `split` would (a task that names
        no fields reads its batches itself: nothing to read), then its inputs' shape against
        `task.input_shape` where the task's node (`task_cfg`) has that key: a sample it
        cannot read ends the run before it starts, in one line."""
        sample = first_sample(dataset)
        if sample is None:
            return
        pair = isinstance(sample, Sequence) and not isinstance(sample, str) and len(sample) == 2
        if self.reads_fields and not pair:  # a dict of named fields, or a sample of another kind
            from gearshift.data.named_fields import read_named_fields

            read_named_fields(self.task, self.chosen, sample)
        elif self.reads_fields:
            self.task.split(default_collate([sample]))  # a pair reads as it is
        if (pair or self.reads_fields) and "input_shape" in task_cfg:
            self._check_input_shape(self.task.split(default_collate([sample]))[0])

    def _check_input_shape(self, inputs: Any) -> None:
        """One line when `task.input_shape` is not the shape of the first sample's `inputs`:
        the example batch built from it (for batch_size=auto and the FLOP count) would
        otherwise meet the model first, and a non-image source under the default task ends
        in a matmul traceback."""
        wanted = getattr(self.task, "input_shape", None)
        if wanted is None:
            return  # a task of one's own that makes its example batch another way
        images_or_values = isinstance(inputs, torch.Tensor) and (
            inputs.is_floating_point() or inputs.dtype == torch.uint8
        )
        if not images_or_values:
            return  # token ids, encoded bytes (data.decode=gpu): not the model's input yet
        shape = list(inputs.shape[1:])
        if shape != list(wanted):
            raise ConfigError(
                f"task.input_shape={list(wanted)} is not allowed; the samples' inputs are "
                f"shaped {shape}: set task.input_shape={shape} (the default follows the image "
                "keys data.channels and data.image_size, which a source without images lacks)"
            )


def first_sample(dataset: Any) -> Any:
    """The first sample a dataset gives (map-style: index 0; a stream: its first)."""
    if hasattr(dataset, "first_sample"):  # a stream that can read one without a full pass
        return dataset.first_sample()
    if hasattr(dataset, "__getitem__") and not isinstance(dataset, IterableDataset):
        return dataset[0] if len(dataset) else None
    return next(iter(dataset), None)


def _names(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)
