"""Any sample structure in, `(inputs, targets)` out: the data node maps named fields.

A source's samples may be `(inputs, targets)` pairs (tensors or nested tuples, lists and
dicts of them), or dicts of named fields, as Hugging Face datasets and many users' own
give them. The DataLoader collates either kind as it is (a dict of samples becomes a dict
of batched tensors); on the way to the task, `FieldReader` takes a dict batch apart:

- `data.fields.inputs` / `data.fields.targets` name the fields (optional keys of the data
  node, never passed to the source);
- without them, the task's own `input_fields` / `target_fields` (Task class attributes)
  are tried in order: `image`/`pixel_values` + `label` for the image tasks, `input_ids`
  (+ `labels`) for `task=lm`.

A source that reads named columns itself (`data=hf`: which column to decode as images) is
given the same names (`FieldReader.names`), so one key, `data.fields`, maps both.

The Task seam is unchanged: a task always receives `(inputs, targets)`. A task whose
targets derive from the inputs (`task=lm`: the next tokens) says so in `from_fields`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import default_collate

from gearshift.config import ConfigError

Batch = tuple[Any, Any]  # (inputs, targets)


class FieldReader:
    """Reads a collated batch as the task's `(inputs, targets)`."""

    def __init__(self, task: Any, fields: Mapping[str, Any] | None = None) -> None:
        fields = {k: v for k, v in (fields or {}).items() if v is not None}  # None: not set
        unknown = set(fields) - {"inputs", "targets"}
        if unknown:
            raise ConfigError(
                f"data.fields={fields} is not allowed; expected the keys inputs and targets "
                "(the sample's field names for each)"
            )
        self.task, self.chosen = task, fields
        self.input_fields = _names(fields.get("inputs")) or tuple(task.input_fields)
        self.target_fields = _names(fields.get("targets")) or tuple(task.target_fields)
        self.targets_optional = getattr(task, "targets_optional", False)
        self.keys: tuple[str, str | None] | None = None  # found on the first dict batch

    def names(self) -> dict[str, str | tuple[str, ...]]:
        """What a source that picks its own columns (`data=hf`) is told: per key the name
        `data.fields` gives, else the task's names to try in order."""
        return {
            "inputs": self.chosen.get("inputs") or self.input_fields,
            "targets": self.chosen.get("targets") or self.target_fields,
        }

    def __call__(self, batch: Any) -> Batch:
        if not isinstance(batch, Mapping):
            inputs, targets = batch  # a pair, as the built-in sources give it
            return inputs, targets
        if self.keys is None:
            self.keys = self.find(batch)
        inputs_key, targets_key = self.keys
        targets = None if targets_key is None else batch[targets_key]
        return self.task.from_fields(batch[inputs_key], targets)

    def find(self, sample: Mapping[str, Any]) -> tuple[str, str | None]:
        """The (inputs, targets) field names of a dict sample, or a one-line ConfigError."""
        inputs = next((name for name in self.input_fields if name in sample), None)
        targets = next((name for name in self.target_fields if name in sample), None)
        if inputs is None or (targets is None and not self.targets_optional):
            raise ConfigError(self.missing(sample))
        return inputs, targets

    def missing(self, sample: Mapping[str, Any]) -> str:
        got = ", ".join(map(str, sample)) or "none"
        wanted = f"inputs from one of: {', '.join(self.input_fields)}"
        if not self.targets_optional:
            wanted += f"; targets from one of: {', '.join(self.target_fields)}"
        if self.chosen:
            return f"data.fields={self.chosen} is not allowed; the samples' fields are {got}; expected {wanted}"
        return (
            f"task._target_={_name(self.task)!r} cannot read the samples: their fields are "
            f"{got}; it reads {wanted}; name yours with data.fields.inputs=NAME "
            "data.fields.targets=NAME"
        )

    def check(self, dataset: Any) -> None:
        """Read the first sample of `dataset` as a batch would be read: a sample the task
        cannot read ends the run before it starts, in one line."""
        sample = first_sample(dataset)
        if sample is None:
            return
        if isinstance(sample, Mapping):
            self.find(sample)
        elif not (
            isinstance(sample, Sequence) and not isinstance(sample, str) and len(sample) == 2
        ):
            raise ConfigError(
                f"data._target_: a sample is a {type(sample).__name__}; expected an "
                "(inputs, targets) pair or a dict of named fields (data.fields)"
            )
        else:
            self(default_collate([sample]))  # a pair reads as it is


def first_sample(dataset: Any) -> Any:
    """The first sample a dataset gives (map-style: index 0; a stream: its first)."""
    if hasattr(dataset, "first_sample"):  # a stream that can read one without a full pass
        return dataset.first_sample()
    if hasattr(dataset, "__getitem__") and not isinstance(
        dataset, torch.utils.data.IterableDataset
    ):
        return dataset[0] if len(dataset) else None
    return next(iter(dataset), None)


def _names(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def _name(task: Any) -> str:
    return f"{type(task).__module__}.{type(task).__name__}"
