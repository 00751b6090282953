"""The keys of the token data (data=synthetic_tokens, data=tokens), the GPT (model=gpt,
model=gpt2) and task=lm, typed: targets.py's descriptions of the language-model targets;
data=synthetic_tokens's values (targets.py `check_data`) and the model against the token data
(checks.py); loaded when a node names one of them, or the data has token windows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from omegaconf import DictConfig

from gearshift.config.rules import check_int, fail
from gearshift.config.targets import DataNode, ModelNode

ACTIVATIONS = ("gelu", "gelu_tanh")  # models/gpt.py: GELU's exact form, or GPT-2's tanh one


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


def check_synthetic_tokens(cfg: DictConfig) -> None:
    """data=synthetic_tokens: windows of data.block_size tokens below data.vocab_size."""
    check_int(cfg, "data.num_samples", 1)
    check_int(cfg, "data.num_val_samples", 0)
    for key in ("data.block_size", "data.vocab_size", "data.successors"):
        check_int(cfg, key, 1)


def check_model_takes_tokens(cfg: DictConfig) -> None:
    """Token data (its node has block_size and vocab_size) and a model that reads them (the
    GPT): its context holds a whole window and its embedding every token id; else the
    first step fails inside the model (a reshape or an index out of range)."""
    data, model = cfg.data, cfg.model
    for key, what in (("block_size", "the data's windows are"), ("vocab_size", "the data has")):
        wanted, has = data.get(key), model.get(key)
        if isinstance(wanted, int) and isinstance(has, int) and has < wanted:
            unit = "tokens" if key == "block_size" else "token ids"
            fail(f"model.{key}", has, f"{what} data.{key}={wanted} {unit}: expected >= {wanted}")
