"""Building the model from its config node, and the model gears (docs/gears.md): memory
format (tip 16), torch.compile (tip 8), activation checkpointing (recompute.py).
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from gearshift.config import ConfigError
from gearshift.config.instantiate import instantiate
from gearshift.config.schema import CompileConfig
from gearshift.config.targets import TRAINER_KEYS


def memory_layout(channels_last: bool) -> torch.memory_format:
    """memory_format.channels_last as torch's format (tip 16), for the model and its inputs."""
    return torch.channels_last if channels_last else torch.contiguous_format


def build_model(
    model_cfg: DictConfig, device: torch.device, memory_format: torch.memory_format
) -> nn.Module:
    """Instantiate `model_cfg` (the model group) on `device`, weights in `memory_format`."""
    return instantiate_model(model_cfg).to(device=device, memory_format=memory_format)


def instantiate_model(model_cfg: DictConfig) -> nn.Module:
    """The model `model_cfg` names, with `model.checkpointing` applied, where torch puts new
    tensors (observe/plan.py: fake ones, on the planned device)."""
    options = OmegaConf.to_container(model_cfg, resolve=True)
    # gearshift's keys, not the model's: the checkpointing gear, model.init_from (build.py's)
    checkpointing, *_ = (options.pop(key, None) for key in TRAINER_KEYS["model"])
    model = instantiate("model", options)
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"model._target_={options['_target_']!r} is not allowed; it built a "
            f"{type(model).__name__}, expected a torch.nn.Module"
        )
    if not checkpointing:
        return model
    from gearshift.models.recompute import apply_activation_checkpointing  # only when asked for

    return apply_activation_checkpointing(model)


def resolve_compile(choice: bool | str, device: torch.device) -> tuple[bool, str]:
    """(compile or not, why): `auto` compiles on CUDA only. On a CPU, compiled float32 models
    measured ~0.8x eager here, and the first compile takes tens of seconds."""
    if choice != "auto":
        return bool(choice), f"compile.enabled={str(bool(choice)).lower()}"
    if device.type == "cuda":
        return True, "auto: on CUDA"
    return False, f"auto: off on {device.type} (compiled models ran ~0.8x eager on CPUs)"


def compile_model(model: nn.Module, cfg: CompileConfig) -> nn.Module:
    """Tip 8: torch.compile fuses pointwise ops and cuts Python overhead (`cfg`: the
    compile node)."""
    return torch.compile(model, mode=cfg.mode, fullgraph=cfg.fullgraph, dynamic=cfg.dynamic)
