"""The autocast dtype `amp=on`, `amp=bf16` and `amp=fp16` resolve to, and why (for the log
and summary.json), each dtype by its short name. Loaded only where amp is not off
(engine/precision.py resolve_amp), and by the advisor.

`amp=bf16` and `amp=fp16` are forced as asked. `amp=on` resolves against the machine it runs
on. On CUDA it is bf16 where the GPU supports it, else fp16. On a CPU, where bf16 and fp16
kernels are native on some chips and emulated (many times slower than float32) on others, it
is bf16 if a short probe (cpu_probe.py, loaded then only) measures it about as fast as
float32, else fp16 where the CPU reports native fp16 kernels and the probe agrees, else
float32 itself.
"""

from __future__ import annotations

import torch

Choice = tuple[torch.dtype | None, str]  # the dtype (None: float32) and why
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
SWITCHES = {"auto": "amp=on", "bfloat16": "amp=bf16", "float16": "amp=fp16"}


def short_name(dtype: torch.dtype | None) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", None: "float32"}.get(
        dtype, str(dtype).removeprefix("torch.")
    )


def choose(choice: str, device: torch.device) -> Choice:
    """amp.dtype ("auto", "bfloat16" or "float16") -> the autocast dtype and why: never a
    dtype a CPU measures slower than float32."""
    if choice != "auto":
        dtype = DTYPES[choice]
        return dtype, f"{short_name(dtype)}: forced by {SWITCHES[choice]}"
    if device.type == "cpu":
        from gearshift.engine.cpu_probe import choose_on_cpu  # measured here only

        return choose_on_cpu(short_name)
    if device.type != "cuda":
        return torch.bfloat16, f"bf16: autocast's usual dtype on {device.type}"
    if torch.cuda.is_bf16_supported():
        return torch.bfloat16, "bf16: this GPU supports it"
    return torch.float16, "fp16 with a GradScaler: this GPU has no bf16"
