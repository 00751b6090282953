"""Sampling tokens from a GPT (models/gpt.py): greedy or with temperature and top-k, with
or without a KV cache.

With the cache the prompt runs once and each new token is one position's forward pass.
A sequence longer than the model's context is cut to its last `block_size` tokens (as
nanoGPT's sample.py does); with absolute position embeddings the cached keys cannot
slide, so from there on each token is a full window's pass, with or without the cache,
and both give the same tokens.
"""

from __future__ import annotations

import torch

from gearshift.models.gpt import GPT, KVCache


def next_token(
    logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None
) -> torch.Tensor:
    """(batch, vocab) logits of the last position -> (batch, 1) ids. temperature 0: argmax."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)


@torch.inference_mode()
def generate(
    model: GPT,
    idx: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """`idx` (batch, time) followed by `max_new_tokens` sampled ids: (batch, time + new)."""
    block = model.block_size
    cache = KVCache(model, idx.shape[0], idx.device) if use_cache else None
    fed = 0  # tokens of `idx` the cache holds
    for _ in range(max_new_tokens):
        if cache is not None and cache.length + idx.shape[1] - fed <= block:
            logits = model(idx[:, fed:], cache)
        else:
            if cache is not None:
                cache.length = 0  # full: the window below is a fresh prompt
            window = idx[:, -block:]
            logits = model(window, cache) if cache is not None else model(window)
        token = next_token(logits[:, -1], temperature, top_k, generator)
        idx = torch.cat([idx, token], dim=1)
        fed = idx.shape[1] - 1
    return idx
