"""The gear advisor: what in this config and model holds the run back, and the fix.

`advise(nodes, model, device)` inspects the config's nodes (`Nodes`: the builder picks
them, build.py `advise_config`), the built model (before torch.compile) and the device, and returns findings, each with a stable id, a message and
the fix. `fit` logs each one once as a warning at start-up and lists them in summary.json
under `advice`; `python -m gearshift.advise [overrides...]` prints them for a config
without training.

Rules that only cost time on a GPU (layer widths under mixed precision, a transformer's
vocabulary and hidden size, the host data loader, cuDNN autotuning) fire only when the
device is CUDA. One rule runs the model: attention by hand is found in one forward pass
of the task's example batch (models with an embedding or an attention module only). Not a rule: gradient
accumulation under DDP without `no_sync` — the loop always uses `no_sync`, and no config
key turns it off, so there is nothing to warn about.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from itertools import pairwise

import torch
from omegaconf import DictConfig, OmegaConf
from torch import fx, nn

from gearshift.config.schema import CompileConfig, DataLoaderConfig, MemoryFormatConfig
from gearshift.data.loading import resolve_num_workers, resolve_pin_memory
from gearshift.engine.precision import (
    cpu_kernels,
    cpu_speed,
    resolve_amp,
    resolve_amp_dtype,
    short_name,
)
from gearshift.models.blocks import recompute_disabled
from gearshift.models.factory import resolve_compile
from gearshift.tasks import build_task

log = logging.getLogger(__name__)

_CONV = nn.modules.conv._ConvNd
_BATCHNORM = nn.modules.batchnorm._BatchNorm
_SHOWN = 4  # layers named in a message before "and N more"


@dataclass(frozen=True)
class Finding:
    id: str  # stable: tests, dashboards and people refer to it
    message: str  # what is wrong, in this run's terms
    fix: str  # what to change

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Nodes:
    """The config the rules read: its nodes and values, as the builder passes them."""

    batch_size: int | str
    cudnn_benchmark: bool
    amp: str  # amp.dtype: what amp_dtype="resolve" resolves
    data: DictConfig
    dataloader: DataLoaderConfig
    memory_format: MemoryFormatConfig
    compile: CompileConfig
    strategy: str | None  # distributed.strategy
    task: DictConfig | None  # None: a config without a task node


@dataclass
class Subject:
    """What the rules look at."""

    nodes: Nodes
    model: nn.Module
    device: torch.device
    amp_dtype: torch.dtype | None

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def batch_size(self) -> int | None:
        batch_size = self.nodes.batch_size
        return batch_size if isinstance(batch_size, int) else None

    @property
    def host_data(self) -> bool:
        return not OmegaConf.select(self.nodes.data, "on_device", default=False)

    def short_last_batch(self) -> int:
        """Samples in the training epoch's short last batch (0: every batch is full)."""
        num_samples = OmegaConf.select(self.nodes.data, "num_samples")
        if self.nodes.dataloader.drop_last or not self.batch_size or not num_samples:
            return 0
        return num_samples % self.batch_size


def _named(pairs: list[str]) -> str:
    more = f" and {len(pairs) - _SHOWN} more" if len(pairs) > _SHOWN else ""
    return ", ".join(pairs[:_SHOWN]) + more


def _unwrapped(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.DataParallel) else model


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


def _widths(module: nn.Module) -> tuple[str, int, str, int] | None:
    if isinstance(module, nn.Linear):
        return "in_features", module.in_features, "out_features", module.out_features
    if isinstance(module, _CONV):
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
        if in_value % 8 and not (isinstance(module, _CONV) and in_value == image_channels):
            odd.append(f"'{name}' ({in_key}={in_value})")  # the image's channels are a given
        if out_value % 8:
            odd.append(f"'{name}' ({out_key}={out_value})")
    if not odd:
        return None
    dtype = str(s.amp_dtype).removeprefix("torch.")
    return Finding(
        "layer-width-multiple-of-8",
        f"{len(odd)} layer width(s) are not multiples of 8 under {dtype} on CUDA, so those "
        f"matmuls miss the tensor cores' fast path: {_named(odd)}",
        "round those widths up to multiples of 8 (a classifier: pad num_classes, e.g. 10 -> 16, "
        "and ignore the extra logits)",
    )


def amp_slower_than_fp32(s: Subject) -> Finding | None:
    if s.device.type != "cpu" or s.amp_dtype is None:
        return None
    speed = cpu_speed(s.amp_dtype)  # amp=on never picks such a dtype: only amp=bf16/fp16 do
    if speed.as_fast_as_float32:
        return None
    name = short_name(s.amp_dtype)
    on_cpu = short_name(resolve_amp("auto", s.device).dtype)
    return Finding(
        "amp-slower-than-fp32",
        f"amp={name}, and on this CPU ({cpu_kernels(s.amp_dtype)}) {name} {speed.describe()}: "
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
            and isinstance(modules.get(source.target), _CONV)
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
                isinstance(first, _CONV)
                and first.bias is not None
                and isinstance(second, _BATCHNORM)
            ):
                dot = f"{prefix}." if prefix else ""
                pairs.append((dot + a, dot + b))
    return pairs


def conv_bias_before_batchnorm(s: Subject) -> Finding | None:
    model = _unwrapped(s.model)
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
        + _named([f"'{conv}' -> '{bn}'" for conv, bn in pairs]),
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


def channels_last_without_conv(s: Subject) -> Finding | None:
    if not s.nodes.memory_format.channels_last:
        return None
    if any(isinstance(m, _CONV) and m.weight.dim() == 4 for m in s.model.modules()):
        return None
    return Finding(
        "channels-last-without-conv",
        f"memory_format=channels_last, but {type(_unwrapped(s.model)).__name__} has no 2-D "
        "convolution: the NHWC layout only helps convolutions, and costs a copy of every input",
        "memory_format=contiguous",
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
    model = _unwrapped(s.model)
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
        f"embedding, the head and every block run in partly filled GPU tiles: {_named(odd)}",
        "pad the vocabulary up to a multiple of 64 (model=gpt: model.pad_vocab_to=64, GPT-2's "
        "50257 -> 50304; the padded ids are never used) and choose a hidden size (n_embd) "
        "that is a multiple of 64",
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
    model = _unwrapped(s.model)
    parameter = next(model.parameters(), None)
    if parameter is None or not _has_attention(model) or s.nodes.task is None:
        return None
    from gearshift.observe.attention_probe import attention_calls  # a model with attention only

    try:
        calls = attention_calls(model, build_task(s.nodes.task), parameter.device)
    except Exception as error:  # a model the example batch does not fit: no verdict
        log.debug("advisor: attention probe of %s failed (%s)", type(model).__name__, error)
        return None
    if not calls.by_hand:
        return None
    return Finding(
        "attention-without-sdpa",
        f"{type(model).__name__} computes attention by hand ({calls.by_hand} softmax over the "
        f"scores per forward pass; {calls.fused} through scaled_dot_product_attention): the "
        "(T, T) score matrix is written to memory and read back, where the fused kernels "
        "(flash, memory-efficient) never build it",
        "torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) (model=gpt "
        "does); nn.MultiheadAttention: need_weights=False",
    )


RULES: list[Callable[[Subject], Finding | None]] = [
    batch_size_multiple_of_8,
    layer_widths_multiple_of_8,
    amp_slower_than_fp32,
    conv_bias_before_batchnorm,
    data_parallel,
    loader_workers,
    loader_pin_memory,
    channels_last_without_conv,
    cudnn_benchmark_varying_shapes,
    compile_short_last_batch,
    transformer_widths_multiple_of_64,
    attention_without_sdpa,
]


def _run(subject: Subject) -> Iterator[Finding]:
    for rule in RULES:
        finding = rule(subject)
        if finding is not None:
            yield finding


def advise(
    nodes: Nodes,
    model: nn.Module,
    device: torch.device,
    amp_dtype: torch.dtype | str | None = "resolve",
) -> list[Finding]:
    """The findings for this config, model and device (amp_dtype: autocast's, if known)."""
    if amp_dtype == "resolve":
        amp_dtype = resolve_amp_dtype(nodes.amp, device)
    return list(_run(Subject(nodes, model, device, amp_dtype)))


def log_findings(findings: list[Finding]) -> None:
    for finding in findings:
        log.warning("advisor [%s]: %s. Fix: %s", finding.id, finding.message, finding.fix)
