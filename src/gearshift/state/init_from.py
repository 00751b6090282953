"""`model.init_from=PATH`: a new run's model starts from saved weights, and nothing else.

PATH is a gearshift checkpoint (its `model` weights; any model; a step folder or an older
single file), a plain state dict
(`python -m gearshift.export format=torch`), or a Hugging Face GPT-2 folder (`config.json`
and `model.safetensors`, loaded into `model=gpt`, models/hf_gpt2.py). The optimizer,
schedule, step and config are the new run's own: this is fine-tuning, not `resume`.

The tensors are checked against the model's: a missing, unexpected or reshaped one ends
the run with one line naming the first of each; `model.init_strict=false` loads the ones
that fit and logs the others, which keep their fresh initialisation.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gearshift.config import ConfigError
from gearshift.models import hf_gpt2
from gearshift.models.gpt import GPT
from gearshift.state.checkpoint_folders import METADATA
from gearshift.state.checkpoint_reads import load_checkpoint

log = logging.getLogger(__name__)

HF_FILES = ("config.json", "model.safetensors")


def init_weights(model: nn.Module, path: str, strict: bool = True) -> dict[str, Any]:
    """Load the weights at `path` into `model` (in place); what was loaded and left out."""
    where = Path(path).expanduser()
    key = f"model.init_from={path!r}"
    if where.is_dir() and not (where / METADATA).is_file():
        state = hf_state(model, where, key)
    elif where.exists():  # a checkpoint folder (DCP), an older checkpoint file, a state dict
        state = checkpoint_state(where, key)
    else:
        raise ConfigError(f"{key} is not allowed; no such file or folder")
    ours = model.state_dict()
    missing = sorted(ours.keys() - state.keys())
    unexpected = sorted(state.keys() - ours.keys())
    reshaped = sorted(k for k in ours.keys() & state.keys() if ours[k].shape != state[k].shape)
    problems = describe(ours, state, missing, unexpected, reshaped)
    if problems and strict:
        raise ConfigError(
            f"{key} is not allowed; its weights do not fit this model: {problems} "
            "(model.init_strict=false loads the tensors that fit)"
        )
    fitting = {k: v for k, v in state.items() if k in ours and k not in reshaped}
    with torch.no_grad():
        for name, tensor in fitting.items():
            ours[name].copy_(tensor)
    if problems:
        log.warning("model.init_from: %d tensors loaded; left as initialised: %s", len(fitting), problems)  # fmt: skip
    else:
        log.info("model.init_from: all %d tensors from %s", len(fitting), where)
    return {"loaded": len(fitting), "missing": missing, "unexpected": unexpected, "reshaped": reshaped}  # fmt: skip


def describe(
    ours: dict[str, torch.Tensor],
    theirs: dict[str, torch.Tensor],
    missing: list[str],
    unexpected: list[str],
    reshaped: list[str],
) -> str:
    """One line: how many of each kind of misfit, and the first ones with their shapes."""

    def first(names: list[str], shapes: Any) -> str:
        shown = ", ".join(f"{n} {shapes(n)}" for n in names[:2])
        return shown + (f", ... ({len(names)})" if len(names) > 2 else "")

    parts = []
    if missing:
        parts.append("missing " + first(missing, lambda n: list(ours[n].shape)))
    if unexpected:
        parts.append("unexpected " + first(unexpected, lambda n: list(theirs[n].shape)))
    if reshaped:
        shape = lambda n: f"{list(theirs[n].shape)} (model: {list(ours[n].shape)})"  # noqa: E731
        parts.append("reshaped " + first(reshaped, shape))
    return "; ".join(parts)


def checkpoint_state(file: Path, key: str) -> dict[str, torch.Tensor]:
    """The model weights of a gearshift checkpoint, or a plain state dict."""
    try:
        saved = load_checkpoint(file)
    except Exception:
        saved = None
    if isinstance(saved, dict) and isinstance(saved.get("model"), dict):
        return saved["model"]
    if isinstance(saved, dict) and saved and all(isinstance(v, torch.Tensor) for v in saved.values()):  # fmt: skip
        return saved  # a plain state dict
    raise ConfigError(
        f"{key} is not allowed; it is not a gearshift checkpoint nor a state dict of tensors "
        "(a Hugging Face GPT-2 folder is given as the folder)"
    )


def hf_state(model: nn.Module, folder: Path, key: str) -> dict[str, torch.Tensor]:
    """A Hugging Face GPT-2 folder's tensors under `model`'s names."""
    absent = [name for name in HF_FILES if not (folder / name).is_file()]
    if absent:
        raise ConfigError(
            f"{key} is not allowed; a folder must be a Hugging Face GPT-2 folder with "
            f"{' and '.join(HF_FILES)} (it lacks {', '.join(absent)})"
        )
    if not isinstance(model, GPT):
        raise ConfigError(
            f"{key} is not allowed; a Hugging Face GPT-2 folder loads into model=gpt, "
            f"not {type(model).__name__}"
        )
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(
            f"{key} is not allowed; its config.json cannot be read: {error}"
        ) from None
    why = hf_gpt2.mismatch(config, model)
    if why:
        raise ConfigError(f"{key} is not allowed; {why}")
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise ConfigError(
            f"{key} needs safetensors, an optional extra: pip install 'gearshift[hf]'"
        ) from None
    return hf_gpt2.from_hf(load_file(folder / "model.safetensors"), model)
