"""The keys of the small models (model=mlp, model=simple_cnn: models/small.py) and of
regression (data=synthetic_regression, task=regression: experiment=regression), typed:
targets.py's descriptions of these targets, loaded when a node names one of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from gearshift.config.targets import DataNode, ModelNode


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
class RegressionNode:
    num_outputs: int
    input_shape: list[int]
