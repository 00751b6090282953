"""NVIDIA GPUs' datasheet figures: the dense peak FLOP/s per compute dtype, the memory and
its bandwidth, found by the device's name. mfu.py's peak on CUDA and observe/plan.py's
targets read them; loaded only there (a run on CUDA, plan=on).
"""

from __future__ import annotations

import re

TERA = 1e12

# Dense peak TFLOP/s per compute dtype ("tf32" = float32 on tensor cores), no sparsity.
# Most specific names first; each name is matched as a word in torch.cuda.get_device_name().
GPU_PEAK_TFLOPS: list[tuple[str, dict[str, float], str]] = [
    (
        "H200 NVL",
        {"float32": 60, "tf32": 417.5, "bfloat16": 835.5, "float16": 835.5},
        "https://www.nvidia.com/en-us/data-center/h200/",
    ),
    (
        "H200",
        {"float32": 67, "tf32": 494.5, "bfloat16": 989.5, "float16": 989.5},
        "https://www.nvidia.com/en-us/data-center/h200/",
    ),
    (
        "H100 NVL",
        {"float32": 60, "tf32": 417.5, "bfloat16": 835.5, "float16": 835.5},
        "https://www.nvidia.com/en-us/data-center/h100/",
    ),
    (
        "H100 PCIe",
        {"float32": 51, "tf32": 378, "bfloat16": 756.5, "float16": 756.5},
        "https://www.nvidia.com/en-us/data-center/h100/",
    ),
    (
        "H100",  # SXM (also named "H100 80GB HBM3")
        {"float32": 67, "tf32": 494.5, "bfloat16": 989.5, "float16": 989.5},
        "https://www.nvidia.com/en-us/data-center/h100/",
    ),
    (
        "A100",  # SXM and PCIe have the same peaks
        {"float32": 19.5, "tf32": 156, "bfloat16": 312, "float16": 312},
        "https://www.nvidia.com/en-us/data-center/a100/",
    ),
    (
        "L40S",
        {"float32": 91.6, "tf32": 183, "bfloat16": 362.05, "float16": 362.05},
        "https://www.nvidia.com/en-us/data-center/l40s/",
    ),
    (
        "L4",
        {"float32": 30.3, "tf32": 60, "bfloat16": 121, "float16": 121},
        "https://www.nvidia.com/en-us/data-center/l4/",
    ),
    (
        "A10",
        {"float32": 31.2, "tf32": 62.5, "bfloat16": 125, "float16": 125},
        "https://www.nvidia.com/en-us/data-center/products/a10-gpu/",
    ),
    (
        "V100",  # SXM2; PCIe: 14 / 112
        {"float32": 15.7, "float16": 125},
        "https://www.nvidia.com/en-us/data-center/v100/",
    ),
    (
        "T4",  # no bfloat16 or TF32 hardware
        {"float32": 8.1, "float16": 65},
        "https://www.nvidia.com/en-us/data-center/tesla-t4/",
    ),
]


# Memory (GB, 1e9 bytes) and its bandwidth (TB/s) of the same models, from the same datasheets:
# what observe/plan.py plans against (A100: the 80 GB SXM; V100: the 32 GB SXM2).
GPU_MEMORY: dict[str, tuple[float, float]] = {
    "H200 NVL": (141, 4.8),
    "H200": (141, 4.8),
    "H100 NVL": (94, 3.9),
    "H100 PCIe": (80, 2.0),
    "H100": (80, 3.35),
    "A100": (80, 2.039),
    "L40S": (48, 0.864),
    "L4": (24, 0.3),
    "A10": (24, 0.6),
    "V100": (32, 0.9),
    "T4": (16, 0.32),
}


def gpu_model(name: str) -> str | None:
    """The table's model that a CUDA device name (or plan.device, h100_pcie) names, or None."""
    name = name.replace("_", " ")
    for model, _, _ in GPU_PEAK_TFLOPS:
        if re.search(r"\b" + r"\s+".join(model.split()) + r"\b", name, re.IGNORECASE):
            return model
    return None


def gpu_peak(name: str, dtype: str) -> tuple[float | None, str]:
    """(dense peak FLOP/s or None, where it came from) for a CUDA device name and dtype."""
    for model, peaks, url in GPU_PEAK_TFLOPS:
        if model == gpu_model(name):
            if dtype not in peaks:
                return None, f"datasheet: {model} has no dense {dtype} peak ({url})"
            return peaks[dtype] * TERA, f"datasheet: {model} dense {dtype} ({url})"
    return None, f"unknown device {name!r}: no peak in the table"
