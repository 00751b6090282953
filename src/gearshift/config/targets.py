"""The keys of the built-in data sources, models and tasks: their types, and the data's values.

A data, model or task node's keys differ by its `_target_`, so the schema holds them as free
dicts. Each built-in target of conf/ has a dataclass (`TYPED`) whose field types
`check_types` holds the node's values to (docs/architecture.md, "Your own dataset"), and
`check_data` checks a built-in source's values and files. A target of your own keeps free
keys; `check_arguments` holds them to its signature, as the build will (instantiate.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from gearshift.config.rules import binds, check_fields, check_int, fail, locate
from gearshift.config.schema import MODEL_KEYS

# The keys of a node that are gearshift's, not arguments of its target.
TRAINER_KEYS = {
    "data": ("on_device", "stage_to", "fields"),  # data/sources.py build_datasets
    "model": ("checkpointing", *MODEL_KEYS),  # models/factory.py, state/init_from.py
    "task": ("metrics", "monitor", "mode"),  # tasks/base.py build_task: what it is judged by
}


@dataclass
class DataNode:
    """gearshift's keys of every source."""

    on_device: bool
    stage_to: str | None
    fields: dict[str, str | list[str] | None] | None


@dataclass
class SyntheticImagesNode(DataNode):
    num_samples: int
    num_val_samples: int
    image_size: int
    channels: int
    num_classes: int
    noise: float
    seed: int


@dataclass
class ModelNode:
    """gearshift's keys of every model."""

    checkpointing: bool
    init_from: str | None
    init_strict: bool


@dataclass
class ResNetNode(ModelNode):
    num_classes: int


@dataclass
class ClassificationNode:
    num_classes: int
    input_shape: list[int]


# The built-in targets' descriptions (classes of gearshift.config) by the _target_ their conf/
# files name (strings: this layer imports no data, models or tasks); those of the other
# *_targets.py modules load only when a node names one of their targets.
TYPED: dict[str, str] = {
    "gearshift.data.synthetic.synthetic_images": "targets.SyntheticImagesNode",
    "gearshift.data.synthetic_regression.synthetic_regression": "small_targets.SyntheticRegressionNode",
    "gearshift.data.tokens.synthetic_tokens": "token_targets.SyntheticTokensNode",
    "gearshift.data.tokens.token_files": "token_targets.TokenFilesNode",
    "gearshift.data.images.image_folder": "disk_targets.ImageFolderNode",
    "gearshift.data.images.cifar10": "disk_targets.Cifar10Node",
    "gearshift.data.shards.shards": "disk_targets.ShardsNode",
    "gearshift.data.hf.hf": "hf_targets.HfNode",
    "gearshift.models.GPT": "token_targets.GPTNode",
    "gearshift.models.MLP": "small_targets.MLPNode",
    "gearshift.models.SimpleCNN": "small_targets.SimpleCNNNode",
    "torchvision.models.resnet18": "targets.ResNetNode",
    "torchvision.models.resnet50": "targets.ResNetNode",
    "gearshift.tasks.Classification": "targets.ClassificationNode",
    "gearshift.tasks.Regression": "small_targets.RegressionNode",
    "gearshift.tasks.LanguageModel": "token_targets.LanguageModelNode",
}


def check_types(cfg: DictConfig, group: str) -> None:
    """The values of the `group` node (data, model, task) against its built-in target's
    description; a target of your own has none."""
    node = cfg[group]
    described = TYPED.get(str(node.get("_target_")))
    if described is not None:
        description = locate(f"{group}._target_", f"gearshift.config.{described}")
        check_fields(node, description, f"{group}.")


def check_arguments(cfg: DictConfig, group: str) -> None:
    """The keys of the `group` node that its target is given are keywords it takes."""
    node = cfg[group]
    target = node.get("_target_")
    found = locate(f"{group}._target_", target)
    given = [str(key) for key in node if key != "_target_" and key not in TRAINER_KEYS[group]]
    if not binds(found, **dict.fromkeys(given)):  # or an argument the build adds is missing
        from gearshift.config.keyword_checks import check_argument_names

        check_argument_names(group, target, found, given)


# The built-in sources by their _target_: the generated ones, checked here (their conf/data
# names); the others' checks (functions of gearshift.config) load for their source only.
SYNTHETIC = {
    "gearshift.data.synthetic.synthetic_images": "synthetic",
    "gearshift.data.synthetic_regression.synthetic_regression": "synthetic_regression",
}
SOURCE_CHECKS = {
    "gearshift.data.tokens.synthetic_tokens": "token_targets.check_synthetic_tokens",
    "gearshift.data.tokens.token_files": "token_files.check_token_config",
    "gearshift.data.hf.hf": "hf_targets.check_hf",
    "gearshift.data.images.image_folder": "disk_checks.check_disk_data",
    "gearshift.data.images.cifar10": "disk_checks.check_disk_data",
    "gearshift.data.shards.shards": "disk_checks.check_disk_data",
}
# Data keys that only act on data read from disk, with their do-nothing values.
DISK_ONLY = {
    "path": None, "stage_to": None, "download": False, "decode": "host", "augment": False,
    "mean": None, "std": None, "batch_dtype": "uint8", "decoder": "auto", "stage_format": "copy",
}  # fmt: skip


def check_data(cfg: DictConfig) -> None:
    """The data node's values for its source; some against the run's (batch_size, device)."""
    target = cfg.data.get("_target_")
    if not target:
        fail("data._target_", target, "name the source: a function that returns the datasets")
    if target in SOURCE_CHECKS:
        locate("data._target_", f"gearshift.config.{SOURCE_CHECKS[target]}")(cfg)
        return
    name = SYNTHETIC.get(target)
    if name is None:
        return  # a source of your own: its code checks its values when it builds the data
    check_int(cfg, "data.num_samples", 1)
    check_int(cfg, "data.num_val_samples", 0)
    for key in ("data.image_size", "data.channels"):
        check_int(cfg, key, 1)
    if name != "synthetic_regression":
        check_int(cfg, "data.num_classes", 2)
    for key, idle in DISK_ONLY.items():
        if cfg.data.get(key, idle) != idle:
            fail(f"data.{key}", cfg.data[key], "it applies to data read from disk only")
    samples = cfg.data.num_samples
    if cfg.dataloader.drop_last and cfg.batch_size != "auto" and samples < cfg.batch_size:
        allowed = f"with dataloader.drop_last=true it must be <= data.num_samples ({samples})"
        fail("batch_size", cfg.batch_size, allowed)


def _token_meta(function: str) -> Callable[[str | None], Any]:
    """A resolver for token_files.py's `function` (a meta file's value): it loads when used."""
    return lambda path: locate("data.path", f"gearshift.config.token_files.{function}")(path)


OmegaConf.register_new_resolver("gearshift_token_vocab", _token_meta("meta_vocab_size"))
OmegaConf.register_new_resolver("gearshift_token_bytes", _token_meta("meta_bytes_per_token"))
