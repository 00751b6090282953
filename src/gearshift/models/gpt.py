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
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool) -> None:
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd={n_embd} is not a multiple of n_head={n_head}")
        self.n_head, self.dropout = n_head, dropout
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.proj = nn.Linear(n_embd, n_embd, bias=bias)  # a residual projection
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, width = x.shape
        # (B, T, 3C) -> three (B, heads, T, head_dim)
        q, k, v = self.qkv(x).view(batch, time, 3, self.n_head, -1).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(  # flash / memory-efficient kernels where they apply
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).reshape(batch, time, width)
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    def __init__(self, n_embd: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.gelu = nn.GELU()
        self.proj = nn.Linear(4 * n_embd, n_embd, bias=bias)  # a residual projection
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(self.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-norm: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = MLP(n_embd, dropout, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
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
    ) -> None:
        super().__init__()
        self.vocab_size, self.block_size = vocab_size, block_size
        self.n_layer, self.n_head, self.n_embd = n_layer, n_head, n_embd
        self.padded_vocab_size = padded(vocab_size, pad_vocab_to)
        self.wte = nn.Embedding(self.padded_vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*(Block(n_embd, n_head, dropout, bias) for _ in range(n_layer)))
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

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        logits = self.lm_head(self.ln_f(self.blocks(x)))
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
