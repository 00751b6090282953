"""`data.fields`: which fields of dict samples a task reads by name, checked up front.

A source's samples may be `(inputs, targets)` pairs (tensors or nested tuples, lists and
dicts of them), or dicts of named fields, as Hugging Face datasets and many users' own
give them. The DataLoader collates either kind as it is (a dict of samples becomes a dict
of batched tensors), and the task receives the batch whole: every field of it, on the
device. A task of your own reads what it needs (`batch["weight"]`); the built-in tasks
read a pair, or a dict by field names (`Task.split`):

- `data.fields.inputs` / `data.fields.targets` name the fields (optional keys of the data
  node, never passed to the source);
- without them, the task's own `input_fields` / `target_fields` (Task class attributes)
  are tried in order: `image`/`pixel_values` + `label` for the image tasks, `input_ids`
  (+ `labels`) for `task=lm`.

A source that reads named columns itself (`data=hf`: which column to decode as images) is
given the same names (`FieldReader.names`), so one key, `data.fields`, maps both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import default_collate

from gearshift.config import ConfigError


class FieldReader:
    """`data.fields` given to the task's `split`, and the first sample checked against it."""

    def __init__(self, task: Any, fields: Mapping[str, Any] | None = None) -> None:
        fields = {k: v for k, v in (fields or {}).items() if v is not None}  # None: not set
        unknown = set(fields) - {"inputs", "targets"}
        if unknown:
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

    def check(self, dataset: Any) -> None:
        """Read the first sample of `dataset` as the task's `split` would: a sample it
        cannot read ends the run before it starts, in one line. A task that names no
        fields reads its batches itself: nothing to check."""
        sample = first_sample(dataset)
        if sample is None or not self.reads_fields:
            return
        if isinstance(sample, Mapping):
            try:
                self.task.split(sample)
            except ConfigError:
                if not self.chosen:
                    raise ConfigError(self.task.unreadable(sample)) from None
                got = ", ".join(map(str, sample)) or "none"
                raise ConfigError(
                    f"data.fields={self.chosen} is not allowed; the samples' fields are {got}; "
                    f"expected {self.task.wanted()}"
                ) from None
        elif not (
            isinstance(sample, Sequence) and not isinstance(sample, str) and len(sample) == 2
        ):
            raise ConfigError(
                f"data._target_: a sample is a {type(sample).__name__}; expected an "
                "(inputs, targets) pair or a dict of named fields (data.fields)"
            )
        else:
            self.task.split(default_collate([sample]))  # a pair reads as it is


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
