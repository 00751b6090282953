"""Tokens per second beside samples per second, for tasks whose samples are tokens
(`Task.tokens_per_sample`: a language model's block size). Derived from the sample counts
the loop already has: no extra read from the device. Loaded for such a task only: its
callers ask `tokens_per_sample` (the closing table, the summary's `tokens_per_sec`) first."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def token_metrics(samples_per_sec: float, tokens_per_sample: int) -> dict[str, float]:
    """W&B's `perf/tokens_per_sec` at a log step (all ranks)."""
    return {"perf/tokens_per_sec": samples_per_sec * tokens_per_sample}


def token_summary(summary: dict[str, Any], tokens_per_sample: int) -> dict[str, float]:
    """summary.json's `tokens` (trained, all ranks), `tokens_per_sec` and
    `tokens_per_sec_per_device`."""
    return {
        "tokens": summary["samples"] * tokens_per_sample,
        "tokens_per_sec": summary["samples_per_sec"] * tokens_per_sample,
        "tokens_per_sec_per_device": summary["samples_per_sec_per_device"] * tokens_per_sample,
    }


def token_rows(summary: dict[str, Any], fmt: Callable[[Any], str]) -> list[tuple[str, str]]:
    """The closing table's rows for them."""
    return [
        ("tokens/s", fmt(summary["tokens_per_sec"])),
        ("tokens/s per device", fmt(summary["tokens_per_sec_per_device"])),
    ]
