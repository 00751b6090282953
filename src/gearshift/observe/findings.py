"""The gear advisor: what in this config and model holds the run back, and the fix.

`advise(nodes, model, device, amp_dtype)` inspects the config's nodes (`Nodes`: build.py
config_advice.py `advise_config` picks them from the config), the built model (before torch.compile) and the
device, and returns findings, each with a stable id, a message and the fix. Loaded only where
asked: with `advise=true` a run logs each finding once as a warning at start-up and lists
them in summary.json under `advice` (build.py `build_run`); `python -m gearshift.advise
[overrides...]` prints them for a config without training.

Rules that only cost time on a GPU (layer widths under mixed precision, a transformer's
vocabulary and hidden size, the host data loader, cuDNN autotuning) fire only when the
device is CUDA: they are in cuda_findings.py, loaded for such a run only. One rule runs the
model: attention by hand is found in one forward pass of the task's example batch
(attention_probe.py, loaded for models with an embedding or an attention module only).
Not a rule: gradient accumulation under DDP without `no_sync` — the loop always uses
`no_sync`, and no config key turns it off, so there is nothing to warn about.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from itertools import pairwise

import torch
from torch import fx, nn

from gearshift.engine.amp_choice import short_name
from gearshift.engine.precision import resolve_amp
from gearshift.models.blocks import recompute_disabled
from gearshift.models.factory import resolve_compile
from gearshift.observe.advisor_base import CONV, Finding, Nodes, Subject, named, unwrapped

log = logging.getLogger(__name__)

_BATCHNORM = nn.modules.batchnorm._BatchNorm


# -- the rules: each returns a Finding or None --------------------------------------------


def batch_size_multiple_of_8(s: Subject) -> Finding | None:
    n = s.batch_size
    if n is None or n % 8 == 0:
        return None
    return Finding(
        "batch-size-multiple-of-8",
        f"batch_size={n} is not a multiple of 8: matmul and convolution kernels (tensor cores, "
        "vector units) work in tiles of 8, so the remainder wastes a partly filled tile",
        f"batch_size={max(8, round(n / 8) * 8)} (or batch_size=auto: the largest multiple of 8 "
        "that fits)",
    )


def amp_slower_than_fp32(s: Subject) -> Finding | None:
    if s.device.type != "cpu" or s.amp_dtype is None:
        return None
    from gearshift.engine.cpu_probe import cpu_kernels, cpu_speed  # amp on a CPU only

    speed = cpu_speed(s.amp_dtype)  # amp=on never picks such a dtype: only amp=bf16/fp16 do
    if speed.as_fast_as_float32:
        return None
    name = short_name(s.amp_dtype)
    on_cpu = short_name(resolve_amp("auto", s.device).dtype)
    kernels = cpu_kernels(s.amp_dtype, name)
    return Finding(
        "amp-slower-than-fp32",
        f"amp={name}, and on this CPU ({kernels}) {name} {speed.describe()}: "
        "mixed precision makes every step slower here, not faster",
        f"amp=on (which picks {on_cpu} on this CPU) or amp=off",
    )


def _conv_bn_pairs_fx(model: nn.Module) -> list[tuple[str, str]]:
    with recompute_disabled():  # trace checkpointed blocks as plain ones
        graph = fx.symbolic_trace(model).graph
    modules = dict(model.named_modules())
    pairs = []
    for node in graph.nodes:
        if node.op != "call_module" or not isinstance(modules.get(node.target), _BATCHNORM):
            continue
        source = node.args[0] if node.args else None
        if (
            isinstance(source, fx.Node)
            and source.op == "call_module"
            and isinstance(modules.get(source.target), CONV)
            and modules[source.target].bias is not None
            and len(source.users) == 1  # the bias reaches nothing but the BatchNorm
        ):
            pairs.append((source.target, node.target))
    return pairs


def _conv_bn_pairs_sequential(model: nn.Module) -> list[tuple[str, str]]:
    """Fallback when tracing fails: a biased conv and a BatchNorm next to each other in a Sequential."""
    pairs = []
    for prefix, module in model.named_modules():
        if not isinstance(module, nn.Sequential):
            continue
        children = list(module.named_children())
        for (a, first), (b, second) in pairwise(children):
            if (
                isinstance(first, CONV)
                and first.bias is not None
                and isinstance(second, _BATCHNORM)
            ):
                dot = f"{prefix}." if prefix else ""
                pairs.append((dot + a, dot + b))
    return pairs


def conv_bias_before_batchnorm(s: Subject) -> Finding | None:
    model = unwrapped(s.model)
    try:
        pairs = _conv_bn_pairs_fx(model)
    except Exception as error:  # data-dependent control flow and friends: fx cannot trace
        log.debug("advisor: fx cannot trace %s (%s); walking Sequentials", type(model), error)
        pairs = _conv_bn_pairs_sequential(model)
    if not pairs:
        return None
    return Finding(
        "conv-bias-before-batchnorm",
        f"{len(pairs)} convolution(s) with a bias feed a BatchNorm directly, which subtracts "
        "the mean right away: the bias is computed, stored and updated for nothing: "
        + named([f"'{conv}' -> '{bn}'" for conv, bn in pairs]),
        "build those convolutions with bias=False (simple_cnn: model.conv_bias=false)",
    )


def data_parallel(s: Subject) -> Finding | None:
    chosen = s.nodes.strategy == "dp"
    wrapped = any(isinstance(m, nn.DataParallel) for m in s.model.modules())
    if not (chosen or wrapped):
        return None
    return Finding(
        "data-parallel",
        "DataParallel drives every GPU from one Python process: it copies the model to each "
        "GPU every step, scatters the batch and gathers the outputs on the first GPU, and all "
        "of it contends for the GIL",
        "distributed=ddp (torchrun --nproc_per_node=N train.py): one process per GPU, the "
        "gradient all-reduce overlapped with the backward pass",
    )


def channels_last_without_conv(s: Subject) -> Finding | None:
    if not s.nodes.memory_format.channels_last:
        return None
    if any(isinstance(m, CONV) and m.weight.dim() == 4 for m in s.model.modules()):
        return None
    return Finding(
        "channels-last-without-conv",
        f"memory_format=channels_last, but {type(unwrapped(s.model)).__name__} has no 2-D "
        "convolution: the NHWC layout only helps convolutions, and costs a copy of every input",
        "memory_format=contiguous",
    )


def compile_short_last_batch(s: Subject) -> Finding | None:
    short = s.short_last_batch()
    compiled = resolve_compile(s.nodes.compile.enabled, s.device)[0]
    if not (compiled and short and s.nodes.compile.dynamic is not True):
        return None
    return Finding(
        "compile-short-last-batch",
        f"compile=on with a short last batch ({short} of {s.batch_size} samples, "
        "dataloader.drop_last=false): the new shape makes torch.compile compile the model "
        "again (or switch to dynamic shapes, which run slower)",
        "dataloader.drop_last=true, or a batch_size that divides data.num_samples",
    )


def _has_attention(model: nn.Module) -> bool:
    """Cheap gate before the probe's forward pass: embeddings or something named attention."""
    return any(
        isinstance(m, (nn.Embedding, nn.MultiheadAttention))
        or "attention" in type(m).__name__.lower()
        or "attn" in type(m).__name__.lower()
        for m in model.modules()
    )


def attention_without_sdpa(s: Subject) -> Finding | None:
    model = unwrapped(s.model)
    if next(model.parameters(), None) is None or not _has_attention(model) or s.nodes.task is None:
        return None
    from gearshift.observe import attention_probe  # a model with attention only

    return attention_probe.attention_without_sdpa(s)


def _on_cuda(name: str) -> Callable[[Subject], Finding | None]:
    """cuda_findings.py's rule `name`, whose module loads only for a run on CUDA."""

    def rule(s: Subject) -> Finding | None:
        if not s.cuda:
            return None
        from gearshift.observe import cuda_findings

        return getattr(cuda_findings, name)(s)

    return rule


RULES: list[Callable[[Subject], Finding | None]] = [
    batch_size_multiple_of_8,
    _on_cuda("layer_widths_multiple_of_8"),
    amp_slower_than_fp32,
    conv_bias_before_batchnorm,
    data_parallel,
    _on_cuda("loader_workers"),
    _on_cuda("loader_pin_memory"),
    channels_last_without_conv,
    _on_cuda("cudnn_benchmark_varying_shapes"),
    compile_short_last_batch,
    _on_cuda("transformer_widths_multiple_of_64"),
    attention_without_sdpa,
]


def advise(
    nodes: Nodes, model: nn.Module, device: torch.device, amp_dtype: torch.dtype | None
) -> list[Finding]:
    """The findings for the config's `nodes` (config_advice.py `advise_config` picks them), `model`
    and `device`, autocast running in `amp_dtype` (None: off)."""
    subject = Subject(nodes, model, device, amp_dtype)
    return [finding for rule in RULES if (finding := rule(subject)) is not None]


def log_findings(findings: list[Finding]) -> None:
    for finding in findings:
        log.warning("advisor [%s]: %s. Fix: %s", finding.id, finding.message, finding.fix)
