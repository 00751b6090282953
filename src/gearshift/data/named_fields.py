"""The first sample that is not an `(inputs, targets)` pair, read before any work: a dict by
its named fields (`data.fields`, else the task's own names), anything else refused, in one
line either way. Loaded for such a sample only (sources.py `FieldReader.check`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gearshift.config import ConfigError


def read_named_fields(task: Any, chosen: dict[str, Any], sample: Any) -> None:
    """Read `sample` as the task's `split` would, by the names `data.fields` gave (`chosen`)."""
    if not isinstance(sample, Mapping):
        raise ConfigError(
            f"data._target_: a sample is a {type(sample).__name__}; expected an "
            "(inputs, targets) pair or a dict of named fields (data.fields)"
        )
    try:
        task.split(sample)
    except ConfigError:
        if not chosen:
            raise  # split's own line: the task's names are not the sample's
        got = ", ".join(map(str, sample)) or "none"
        raise ConfigError(
            f"data.fields={chosen} is not allowed; the samples' fields are {got}; "
            f"expected {task.wanted()}"
        ) from None
