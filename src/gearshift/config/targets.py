"""The keys of the built-in data sources, models and tasks, typed.

A data, model or task node's keys differ by its `_target_`, so the schema holds them as
free dicts (schema.py `Config`). Each built-in target of conf/data, conf/model and
conf/task has a dataclass here, chosen by the node's `_target_` (named as a string: this
layer does not import the data, models or tasks), whose field types `check_fields` holds
the node's values to at start: `data.streaming=sometimes` is one line, not a run that
streams. A target of your own keeps free keys; `check_arguments` holds them to its
signature, as the build will (instantiate.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from omegaconf import DictConfig

from gearshift.config.instantiate import check_keywords
from gearshift.config.rules import check_fields, locate
from gearshift.config.schema import MODEL_KEYS

# The keys of a node that are gearshift's, not arguments of its target.
TRAINER_KEYS = {
    "data": ("on_device", "stage_to", "fields"),  # data/sources.py build_datasets
    "model": ("checkpointing", *MODEL_KEYS),  # models/factory.py, state/init_from.py
    "task": ("metrics", "monitor", "mode"),  # tasks/base.py build_task: what it is judged by
}
# The values of the image sources' keys (checked again in disk_checks.py).
CHECK_IMAGES = ("header", "decode", "off")
BATCH_DTYPES = ("uint8", "float32")  # data/images.py host_transform
DECODERS = ("auto", "pil", "torchvision", "simplejpeg")  # data/decode.py
STAGE_FORMATS = ("copy", "jpeg", "raw")  # data/resized.py
DECODES = ("host", "gpu")  # data.decode of data=imagefolder (data/gpu_decode.py)
ACTIVATIONS = ("gelu", "gelu_tanh")  # models/gpt.py: GELU's exact form, or GPT-2's tanh one


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
class SyntheticRegressionNode(DataNode):
    num_samples: int
    num_val_samples: int
    image_size: int
    channels: int
    num_outputs: int
    noise: float
    seed: int


@dataclass
class SyntheticTokensNode(DataNode):
    num_samples: int
    num_val_samples: int
    block_size: int
    vocab_size: int
    successors: int
    seed: int


@dataclass
class TokenFilesNode(DataNode):
    path: str | None  # null: config/token_files.py says to set it
    block_size: int
    vocab_size: int | None  # null: no meta file to read it from (token_files.py says so)
    num_samples: int | None
    num_val_samples: int | None


@dataclass
class ImagesNode(DataNode):
    """The keys every image source read from disk has."""

    path: str | None  # null: data_checks.py asks for the folder
    num_classes: int
    image_size: int
    channels: int
    num_samples: int | None
    num_val_samples: int | None
    split_seed: int
    augment: bool
    mean: list[float] | None
    std: list[float] | None
    batch_dtype: Literal[BATCH_DTYPES]


@dataclass
class Cifar10Node(ImagesNode):
    download: bool


@dataclass
class ImageFolderNode(ImagesNode):
    val_fraction: float
    check_images: Literal[CHECK_IMAGES]
    decode: Literal[DECODES]
    stage_format: Literal[STAGE_FORMATS]
    stage_quality: int
    decoder: Literal[DECODERS]


@dataclass
class ShardsNode(ImagesNode):
    val_path: str | list[str] | None  # the validation shards where `path` holds none
    decoder: Literal[DECODERS]
    streaming: bool
    label_key: str


@dataclass
class HfNode(ImagesNode):
    name: str | None
    split: str
    val_split: str | None
    decoder: Literal[DECODERS]
    streaming: bool


@dataclass
class ModelNode:
    """gearshift's keys of every model."""

    checkpointing: bool
    init_from: str | None
    init_strict: bool


@dataclass
class GPTNode(ModelNode):
    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float
    bias: bool
    activation: Literal[ACTIVATIONS]
    pad_vocab_to: int


@dataclass
class MLPNode(ModelNode):
    in_shape: list[int]
    num_classes: int
    hidden: int


@dataclass
class SimpleCNNNode(ModelNode):
    in_channels: int
    num_classes: int
    width: int
    conv_bias: bool


@dataclass
class ResNetNode(ModelNode):
    num_classes: int


@dataclass
class ClassificationNode:
    num_classes: int
    input_shape: list[int]


@dataclass
class RegressionNode:
    num_outputs: int
    input_shape: list[int]


@dataclass
class LanguageModelNode:
    vocab_size: int
    block_size: int
    ignore_index: int
    bytes_per_token: float | None
    sample_every: int | None
    sample_prompt: str | None
    sample_tokens: int
    sample_count: int
    sample_temperature: float


# The built-in targets' descriptions, by the _target_ their conf/ files name.
TYPED: dict[str, type] = {
    "gearshift.data.synthetic.synthetic_images": SyntheticImagesNode,
    "gearshift.data.synthetic_regression.synthetic_regression": SyntheticRegressionNode,
    "gearshift.data.tokens.synthetic_tokens": SyntheticTokensNode,
    "gearshift.data.tokens.token_files": TokenFilesNode,
    "gearshift.data.images.image_folder": ImageFolderNode,
    "gearshift.data.images.cifar10": Cifar10Node,
    "gearshift.data.shards.shards": ShardsNode,
    "gearshift.data.hf.hf": HfNode,
    "gearshift.models.GPT": GPTNode,
    "gearshift.models.MLP": MLPNode,
    "gearshift.models.SimpleCNN": SimpleCNNNode,
    "torchvision.models.resnet18": ResNetNode,
    "torchvision.models.resnet50": ResNetNode,
    "gearshift.tasks.Classification": ClassificationNode,
    "gearshift.tasks.Regression": RegressionNode,
    "gearshift.tasks.LanguageModel": LanguageModelNode,
}


def check_types(cfg: DictConfig, group: str) -> None:
    """The values of the `group` node (data, model, task) against its built-in target's
    description; a target of your own has none."""
    node = cfg[group]
    description = TYPED.get(str(node.get("_target_")))
    if description is not None:
        check_fields(node, description, f"{group}.")


def check_arguments(cfg: DictConfig, group: str) -> None:
    """The keys of the `group` node that its target is given are keywords it takes."""
    node = cfg[group]
    target = node.get("_target_")
    found = locate(f"{group}._target_", target)
    given = [str(key) for key in node if key != "_target_" and key not in TRAINER_KEYS[group]]
    check_keywords(group, target, found, given)
