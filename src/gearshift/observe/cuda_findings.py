"""The advisor's rules that only cost time on a GPU (layer widths under mixed precision, a
transformer's vocabulary and hidden size, the host data loader, cuDNN autotuning):
findings.py loads them for a run on CUDA only."""

from __future__ import annotations

import torch
from omegaconf import OmegaConf
from torch import nn

from gearshift.data.host_loader import resolve_num_workers, resolve_pin_memory
from gearshift.observe.advisor_base import CONV, Finding, Subject, named, unwrapped


def _widths(module: nn.Module) -> tuple[str, int, str, int] | None:
    if isinstance(module, nn.Linear):
        return "in_features", module.in_features, "out_features", module.out_features
    if isinstance(module, CONV):
        return "in_channels", module.in_channels, "out_channels", module.out_channels
    return None


def layer_widths_multiple_of_8(s: Subject) -> Finding | None:
    if not s.cuda or s.amp_dtype not in (torch.float16, torch.bfloat16):
        return None
    image_channels = OmegaConf.select(s.nodes.data, "channels")
    odd = []
    for name, module in s.model.named_modules():
        widths = _widths(module)
        if widths is None:
            continue
        in_key, in_value, out_key, out_value = widths
        if in_value % 8 and not (isinstance(module, CONV) and in_value == image_channels):
            odd.append(f"'{name}' ({in_key}={in_value})")  # the image's channels are a given
        if out_value % 8:
            odd.append(f"'{name}' ({out_key}={out_value})")
    if not odd:
        return None
    dtype = str(s.amp_dtype).removeprefix("torch.")
    return Finding(
        "layer-width-multiple-of-8",
        f"{len(odd)} layer width(s) are not multiples of 8 under {dtype} on CUDA, so those "
        f"matmuls miss the tensor cores' fast path: {named(odd)}",
        "round those widths up to multiples of 8 (a classifier: pad num_classes, e.g. 10 -> 16, "
        "and ignore the extra logits)",
    )


def loader_workers(s: Subject) -> Finding | None:
    if not (s.cuda and s.host_data):
        return None
    if resolve_num_workers(s.nodes.dataloader.num_workers, s.device) > 0:
        return None
    return Finding(
        "loader-no-workers",
        "dataloader.num_workers=0 while training on CUDA from host data: the training "
        "process loads every batch itself, and the GPU waits meanwhile",
        "dataloader.num_workers=auto (4 per GPU, capped by the CPUs), or dataloader=tuned",
    )


def loader_pin_memory(s: Subject) -> Finding | None:
    if not (s.cuda and s.host_data):
        return None
    if resolve_pin_memory(s.nodes.dataloader.pin_memory, s.device):
        return None
    return Finding(
        "loader-no-pin-memory",
        "dataloader.pin_memory is off while training on CUDA from host data: each batch is "
        "staged through a pageable buffer, and the copy cannot overlap compute",
        "dataloader.pin_memory=auto and dataloader.non_blocking=true (or dataloader=tuned)",
    )


def cudnn_benchmark_varying_shapes(s: Subject) -> Finding | None:
    short = s.short_last_batch()
    if not (s.cuda and s.nodes.cudnn_benchmark and short):
        return None
    return Finding(
        "cudnn-benchmark-varying-shapes",
        f"cudnn_benchmark=true with a short last batch ({short} of {s.batch_size} samples, "
        "dataloader.drop_last=false): every new input shape is autotuned again, and the "
        "tuning lands in the step times",
        "dataloader.drop_last=true, or a batch_size that divides data.num_samples",
    )


def _vocabularies(model: nn.Module) -> list[tuple[str, int]]:
    """(name, rows) of the token embeddings whose rows are also a linear head's outputs (the
    vocabulary: tied, or the same size): a lookup costs nothing, the head's matmul does."""
    heads = [m for m in model.modules() if isinstance(m, nn.Linear)]
    return [
        (name, module.num_embeddings)
        for name, module in model.named_modules()
        if isinstance(module, nn.Embedding)
        and any(h.weight is module.weight or h.out_features == module.num_embeddings for h in heads)
    ]


def transformer_widths_multiple_of_64(s: Subject) -> Finding | None:
    if not s.cuda:
        return None
    model = unwrapped(s.model)
    odd = [f"'{name}' (vocabulary {rows})" for name, rows in _vocabularies(model) if rows % 64]
    odd += [
        f"'{name}' (hidden size {m.embedding_dim})"
        for name, m in model.named_modules()
        if isinstance(m, nn.Embedding) and m.embedding_dim % 64
    ]
    if not odd:
        return None
    return Finding(
        "transformer-width-multiple-of-64",
        f"{len(odd)} transformer size(s) are not multiples of 64, so the matmuls of the "
        f"embedding, the head and every block run in partly filled GPU tiles: {named(odd)}",
        "pad the vocabulary up to a multiple of 64 (model=gpt: model.pad_vocab_to=64, GPT-2's "
        "50257 -> 50304; the padded ids are never used) and choose a hidden size (n_embd) "
        "that is a multiple of 64",
    )
