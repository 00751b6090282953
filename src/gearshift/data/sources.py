"""The data seam (docs/make-it-yours.md, "gearshift's keys of the data node"): a source,
chosen by `data._target_`, takes the node's other keys and returns `(train, validation or
None)`, map-style or streams (data/streams.py); gearshift's keys (`data.on_device`,
`data.stage_to`, `data.fields`) are not passed on as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import Dataset, IterableDataset

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
