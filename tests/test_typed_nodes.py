"""The data, model and task nodes' keys (config/targets.py): a built-in target's values are
held to its dataclass's field types, one's own target's keys to its signature; each bad
value is one line at start, exit 2, no run folder. Every conf/ file's defaults pass, so
the dataclasses cannot drift from the yaml or from the targets' signatures."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Literal

import pytest
import torch
from helpers import CONF, make_cfg, train_in_process
from omegaconf import OmegaConf

from gearshift.config import ConfigError
from gearshift.config.rules import check_fields, locate
from gearshift.config.targets import TRAINER_KEYS, TYPED, DataNode, ModelNode, check_types
from gearshift.config.token_targets import ACTIVATIONS


class Head(torch.nn.Module):
    """One's own model: its node's keys are free, held to this signature."""

    def __init__(self, num_classes: int, hidden: int = 8) -> None:
        super().__init__()
        self.layer = torch.nn.LazyLinear(num_classes)


BAD_VALUES = [
    # data=hf's and data=shards' data.streaming: tests/test_hf_data.py, tests/test_shards.py
    ("data.on_device=yes", "data.on_device='yes' is not allowed; choose true or false"),
    (
        "data=cifar10 data.mean=0.5",
        "data.mean=0.5 is not allowed; expected a list of numbers or null",
    ),
    ("model=simple_cnn model.width=wide", "model.width='wide' is not allowed; expected an integer"),
    ("model=mlp model.hidden=1.5", "model.hidden=1.5 is not allowed; expected an integer"),
    ("model.checkpointing=1", "model.checkpointing=1 is not allowed; choose true or false"),
    (
        "experiment=lm model.activation=relu",
        "model.activation='relu' is not allowed; choose one of: gelu, gelu_tanh",
    ),
    (
        "experiment=lm task.sample_every=often",
        "task.sample_every='often' is not allowed; expected an integer or null",
    ),
    (
        "experiment=lm task.sample_temperature=hot",
        "task.sample_temperature='hot' is not allowed; expected a number",
    ),
    (
        "model._target_=test_typed_nodes.Head +model.bogus=1",
        "model._target_='test_typed_nodes.Head' is not allowed; got an unexpected keyword "
        "argument 'bogus'; it takes: num_classes, hidden",
    ),
    (  # a built-in target's key it does not take: its signature says so too
        "+task.bogus=1",
        "task._target_='gearshift.tasks.Classification' is not allowed; got an unexpected "
        "keyword argument 'bogus'; it takes: num_classes, input_shape",
    ),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_VALUES)
def test_a_bad_key_of_a_source_model_or_task_is_one_line_before_any_run_folder(
    tmp_path, overrides, message
):
    done = train_in_process(*overrides.split(), "max_steps=1", cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.splitlines() == [f"error: {message}"]
    assert list(tmp_path.iterdir()) == []


@dataclass
class Described:
    switch: bool
    count: int
    rate: float
    name: str | None
    sizes: list[int]
    mode: Literal["a", "b"]


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("switch", "yes", "choose true or false"),
        ("switch", 1, "choose true or false"),
        ("count", True, "expected an integer"),
        ("count", 2.0, "expected an integer"),
        ("rate", "fast", "expected a number"),
        ("name", 3, "expected a string or null"),
        ("sizes", [1, "2"], "expected a list of integers"),
        ("sizes", 1, "expected a list of integers"),
        ("mode", "c", "choose one of: a, b"),
    ],
)
def test_a_field_type_refuses_what_it_does_not_hold(key, value, allowed):
    node = OmegaConf.create({"switch": False, "count": 1, "rate": 0.5, "name": None,
                             "sizes": [1], "mode": "a"} | {key: value})  # fmt: skip
    with pytest.raises(ConfigError) as error:
        check_fields(node, Described, "x.")
    assert str(error.value) == f"x.{key}={value!r} is not allowed; {allowed}"


def test_ints_pass_for_floats_and_null_for_optional_fields():
    node = OmegaConf.create({"switch": True, "count": 3, "rate": 1, "name": None,
                             "sizes": [], "mode": "b", "free": "any"})  # fmt: skip
    check_fields(node, Described, "x.")


# The data a model or task file reads its values from (its interpolations).
COMPANIONS = {
    "model=gpt": "data=synthetic_tokens",
    "model=gpt2": "data=synthetic_tokens",
    "task=lm": "data=synthetic_tokens",
    "task=regression": "data=synthetic_regression",
}
FILES = [f"{folder}={file.stem}" for folder in ("data", "model", "task")
         for file in sorted((CONF / folder).glob("*.yaml"))]  # fmt: skip
BASES = {"data": DataNode, "model": ModelNode, "task": None}


@pytest.mark.parametrize("choice", FILES)
def test_every_built_in_file_is_typed_and_its_defaults_pass(choice):
    group = choice.partition("=")[0]
    companion = (COMPANIONS[choice],) if choice in COMPANIONS else ()
    cfg = make_cfg(choice, *companion, tiny=False)
    node = cfg[group]
    # every built-in target has its description
    description = locate("_target_", f"gearshift.config.{TYPED[node._target_]}")
    check_types(cfg, group)
    fields = {f.name for f in dataclasses.fields(description)}
    keys = set(node) - {"_target_"}
    assert keys <= fields, f"{choice}: keys without a type: {keys - fields}"
    base = {f.name for f in dataclasses.fields(BASES[group])} if BASES[group] else set()
    assert fields - base <= keys, f"{choice}: fields its file lacks: {fields - base - keys}"
    parameters = inspect.signature(locate("_target_", node._target_)).parameters.values()
    if not any(p.kind is p.VAR_KEYWORD for p in parameters):
        arguments = fields - set(TRAINER_KEYS[group])
        assert arguments <= {p.name for p in parameters}, f"{choice}: not arguments"


def test_the_gpt_activations_typed_are_the_models():
    from gearshift.models import gpt

    assert tuple(gpt.ACTIVATIONS) == ACTIVATIONS
