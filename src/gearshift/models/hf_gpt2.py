"""Hugging Face GPT-2 (`GPT2LMHeadModel`) <-> gearshift's GPT (models/gpt.py): tensor names,
the transposed Conv1D weights and the config that describes the same network.

GPT-2's `Conv1D` layers keep their weights as (in, out), the transpose of nn.Linear's
(out, in); `c_attn` packs query, key and value along its output in the order our `qkv`
does (all heads of q, then k, then v), so a transpose is the whole mapping. GPT-2 has
biases everywhere and the tanh GELU (`gelu_new`): a GPT that loads its weights needs
`model.bias=true` and `model.activation=gelu_tanh`; a GPT without biases exports zero ones.
The padded vocabulary rows of ours
(pad_vocab_to) are not GPT-2's: they are left out on export and kept on import.
"""

from __future__ import annotations

from typing import Any

import torch

from gearshift.models.gpt import GPT

# GPT-2's activation names and ours
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")  # transposed
BLOCK_NAMES = {  # GPT-2's name in a block -> ours
    "ln_1": "ln_1",
    "attn.c_attn": "attn.qkv",
    "attn.c_proj": "attn.proj",
    "ln_2": "ln_2",
    "mlp.c_fc": "mlp.fc",
    "mlp.c_proj": "mlp.proj",
}


def mismatch(config: dict[str, Any], model: GPT) -> str | None:
    """Why `model` cannot hold the GPT-2 of `config` (config.json), or None."""
    if config.get("model_type") != "gpt2":
        return f"its config.json describes model_type {config.get('model_type')!r}, not gpt2"
    wanted = {
        "n_layer": config.get("n_layer"),
        "n_head": config.get("n_head"),
        "n_embd": config.get("n_embd"),
        "vocab_size": config.get("vocab_size"),
        "bias": True,
        "activation": ACTIVATIONS.get(config.get("activation_function", "gelu_new"), "?"),
    }
    for key, value in wanted.items():
        if getattr(model, key) != value:
            return f"it is a GPT-2 with {key}={value}, this model has model.{key}={getattr(model, key)}"  # fmt: skip
    if model.block_size > config.get("n_positions", 0):
        return f"its context is {config.get('n_positions')} positions, model.block_size={model.block_size}"  # fmt: skip
    return None


def from_hf(tensors: dict[str, torch.Tensor], model: GPT) -> dict[str, torch.Tensor]:
    """GPT-2's tensors (safetensors names, with or without `transformer.`) as `model`'s
    state dict; names GPT-2 has no tensor for are absent (the caller reports them)."""
    plain = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    state: dict[str, torch.Tensor] = {}
    ours = model.state_dict()
    wte = plain.get("wte.weight")
    if wte is not None:  # our padded rows stay as they are
        padded = ours["wte.weight"].clone()
        padded[: wte.shape[0]] = wte
        state["wte.weight"] = state["lm_head.weight"] = padded
    if "wpe.weight" in plain:
        state["wpe.weight"] = plain["wpe.weight"][: model.block_size]
    for end in ("weight", "bias"):
        if f"ln_f.{end}" in plain:
            state[f"ln_f.{end}"] = plain[f"ln_f.{end}"]
    for i in range(model.n_layer):
        for theirs, name in BLOCK_NAMES.items():
            for end in ("weight", "bias"):
                tensor = plain.get(f"h.{i}.{theirs}.{end}")
                if tensor is None:
                    continue
                if theirs in CONV1D and end == "weight":
                    tensor = tensor.t()
                state[f"blocks.{i}.{name}.{end}"] = tensor.contiguous()
    return state


def bias_of(state: dict[str, torch.Tensor], layer: str) -> torch.Tensor:
    """A layer's bias, or zeros for a GPT without biases (GPT-2 always has them; a zero
    bias computes what none does)."""
    if f"{layer}.bias" in state:
        return state[f"{layer}.bias"].clone()
    weight = state[f"{layer}.weight"]
    return torch.zeros(weight.shape[0], dtype=weight.dtype)


def to_hf(model: GPT) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """`model`'s weights under GPT-2's names (Conv1D transposed, the real vocabulary's rows)
    and the config.json that describes it for transformers."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    tensors = {
        "transformer.wte.weight": state["wte.weight"][: model.vocab_size].clone(),
        "transformer.wpe.weight": state["wpe.weight"].clone(),
    }
    tensors["transformer.ln_f.weight"] = state["ln_f.weight"].clone()
    tensors["transformer.ln_f.bias"] = bias_of(state, "ln_f")
    for i in range(model.n_layer):
        for theirs, name in BLOCK_NAMES.items():
            for end in ("weight", "bias"):
                key = f"blocks.{i}.{name}"
                tensor = state[f"{key}.weight"] if end == "weight" else bias_of(state, key)
                if theirs in CONV1D and end == "weight":
                    tensor = tensor.t()
                tensors[f"transformer.h.{i}.{theirs}.{end}"] = tensor.contiguous().clone()
    activation = {"gelu_tanh": "gelu_new", "gelu": "gelu"}[model.activation]
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": model.vocab_size,
        "n_positions": model.block_size,
        "n_ctx": model.block_size,
        "n_embd": model.n_embd,
        "n_layer": model.n_layer,
        "n_head": model.n_head,
        "n_inner": None,
        "activation_function": activation,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "layer_norm_epsilon": 1e-5,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "bos_token_id": model.vocab_size - 1,
        "eos_token_id": model.vocab_size - 1,
    }
    return tensors, config
