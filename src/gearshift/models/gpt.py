"""`model=gpt` / `model=gpt2`: a decoder-only transformer in the manner of nanoGPT.

Token and position embeddings, `n_layer` pre-norm blocks (LayerNorm -> causal
self-attention through `F.scaled_dot_product_attention`, LayerNorm -> a 4x MLP with GELU),
a final LayerNorm and a linear head that shares the token embedding's weight. GPT-2's
initialisation: normal(0, 0.02) everywhere, the two residual projections of each block
scaled by 1/sqrt(2 * n_layer) so the residual stream's variance does not grow with depth.

The vocabulary is padded up to a multiple of `pad_vocab_to` (tip 9: GPT-2's 50257 becomes
50304, a width the matmul kernels tile evenly); the padded ids are never inputs, and the
forward pass returns only the real vocabulary's logits, so the loss, the perplexity and any
argmax see `vocab_size` classes. The blocks are the children of `model.blocks`, an
nn.Sequential: activation checkpointing and per-block FSDP find them there.

Generation passes a `KVCache` (models/sampling.py): each attention appends its new keys
and values to the cache and attends over all of them, so a new token costs one position's
work instead of the whole window's. Without a cache (training, validation) the forward
pass is the plain causal one (`is_causal=True`, the fused kernels).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class KVCache:
    """Keys and values of every layer for the positions seen so far: preallocated
    (layers, batch, heads, length, head_dim) tensors and the count of positions filled."""

    def __init__(
        self, model: GPT, batch: int, device: torch.device, dtype: torch.dtype | None = None
    ) -> None:
        shape = (model.n_layer, batch, model.n_head, model.block_size, model.head_dim)
        dtype = dtype or model.wte.weight.dtype
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0  # positions filled (the next token's position)

    def append(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store `layer`'s keys and values of the new positions; all of its keys and values."""
        end = self.length + k.shape[2]
        self.keys[layer, :, :, self.length : end] = k
        self.values[layer, :, :, self.length : end] = v
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool) -> None:
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd={n_embd} is not a multiple of n_head={n_head}")
        self.n_head, self.dropout = n_head, dropout
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.proj = nn.Linear(n_embd, n_embd, bias=bias)  # a residual projection
        self.resid_dropout = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0
    ) -> torch.Tensor:
        batch, time, width = x.shape
        # (B, T, 3C) -> three (B, heads, T, head_dim)
        q, k, v = self.qkv(x).view(batch, time, 3, self.n_head, -1).permute(2, 0, 3, 1, 4)
        if cache is None:
            y = F.scaled_dot_product_attention(  # flash / memory-efficient kernels where they apply
                q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
            )
        else:
            y = cached_attention(q, k, v, cache, layer)
        y = y.transpose(1, 2).reshape(batch, time, width)
        return self.resid_dropout(self.proj(y))


def cached_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache, layer: int
) -> torch.Tensor:
    """The new positions' queries against every cached position and themselves: each new
    position sees the cached ones and the new ones up to itself."""
    start = cache.length
    k, v = cache.append(layer, k, v)
    if start == 0:  # the prompt: plain causal attention
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if q.shape[2] == 1:  # one new token sees everything before it
        return F.scaled_dot_product_attention(q, k, v)
    rows = torch.arange(start, start + q.shape[2], device=q.device)[:, None]
    mask = torch.arange(k.shape[2], device=q.device)[None, :] <= rows
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


ACTIVATIONS = {"gelu": "none", "gelu_tanh": "tanh"}  # GELU's exact form, or GPT-2's tanh one


class MLP(nn.Module):
    def __init__(self, n_embd: int, dropout: float, bias: bool, activation: str = "gelu") -> None:
        super().__init__()
        self.fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.gelu = nn.GELU(approximate=ACTIVATIONS[activation])
        self.proj = nn.Linear(4 * n_embd, n_embd, bias=bias)  # a residual projection
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(self.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-norm: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(
        self, n_embd: int, n_head: int, dropout: float, bias: bool, activation: str = "gelu"
    ) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = MLP(n_embd, dropout, bias, activation)

    def forward(
        self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0
    ) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cache, layer)
        return x + self.mlp(self.ln_2(x))


def padded(size: int, multiple: int) -> int:
    """`size` rounded up to a multiple of `multiple` (1 or less: unchanged)."""
    return size if multiple <= 1 else -(-size // multiple) * multiple


class GPT(nn.Module):
    """Token ids (batch, time <= block_size), int64 -> logits (batch, time, vocab_size)."""

    def __init__(
        self,
        vocab_size: int,
        block_size: int,
        n_layer: int = 4,
        n_head: int = 4,
        n_embd: int = 128,
        dropout: float = 0.0,
        bias: bool = False,
        pad_vocab_to: int = 64,
        activation: str = "gelu",
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation={activation!r}: choose one of {', '.join(ACTIVATIONS)}")
        self.vocab_size, self.block_size = vocab_size, block_size
        self.bias, self.activation = bias, activation
        self.n_layer, self.n_head, self.n_embd = n_layer, n_head, n_embd
        self.padded_vocab_size = padded(vocab_size, pad_vocab_to)
        self.wte = nn.Embedding(self.padded_vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(
            *(Block(n_embd, n_head, dropout, bias, activation) for _ in range(n_layer))
        )
        self.ln_f = nn.LayerNorm(n_embd, bias=bias)
        self.lm_head = nn.Linear(n_embd, self.padded_vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying: one matrix, in and out
        self.apply(self._init_weights)
        residual_std = 0.02 / math.sqrt(2 * n_layer)
        for block in self.blocks:
            for projection in (block.attn.proj, block.mlp.proj):
                nn.init.normal_(projection.weight, mean=0.0, std=residual_std)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def forward(self, idx: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Logits of every position of `idx`; with `cache`, `idx` continues the positions
        the cache holds (their keys and values are reused, the new ones appended)."""
        start = 0 if cache is None else cache.length
        if start + idx.shape[1] > self.block_size:
            raise ValueError(
                f"{start + idx.shape[1]} positions exceed the context of {self.block_size}"
            )
        positions = torch.arange(start, start + idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        if cache is None:
            x = self.blocks(x)
        else:
            for layer, block in enumerate(self.blocks):
                x = block(x, cache, layer)
            cache.length += idx.shape[1]
        logits = self.lm_head(self.ln_f(x))
        if self.padded_vocab_size != self.vocab_size:
            logits = logits[..., : self.vocab_size]  # the padded ids never win
        return logits

    def num_params(self, position_embeddings: bool = False) -> int:
        """Parameters counted once (the tied head is the token embedding), by default without
        the position embeddings, as nanoGPT's FLOP estimate counts them."""
        total = sum(p.numel() for p in self.parameters())  # parameters() skips the tied repeat
        return total if position_embeddings else total - self.wpe.weight.numel()

    def flops_per_token(self, time: int) -> float:
        """Forward + backward FLOPs per token at sequence length `time` (PaLM's appendix B,
        as nanoGPT's estimate_mfu): 6 per parameter (2 forward, 4 backward) without the
        position embeddings (a lookup, no matmul), plus attention's scores and weighted sum,
        12 x layers x heads x head_dim x time (the full T x T, causal mask or not)."""
        attention = 12 * self.n_layer * self.n_head * self.head_dim * time
        return 6 * self.num_params() + attention
