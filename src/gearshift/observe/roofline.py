"""A step's time by the roofline: each operator takes the longer of its arithmetic at the
device's peak FLOP/s and its bytes (inputs read, outputs written) at the memory bandwidth.

It runs as a TorchDispatchMode, so it works on fake tensors (observe/plan.py) and sees the
operators as dispatched: autocast's casts, the backward's kernels, the optimizer's. The
FLOPs come from torch's FlopCounterMode formulas (matmuls, convolutions, attention); ops
without one count their bytes only. Launch overheads, kernel efficiency below the peak and
communication are left out: it is a lower bound of the step time, the time a perfect kernel
would take.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from gearshift.observe.mfu import CPU_ATTENTION_FLOPS

FORMULAS = {**flop_registry, **CPU_ATTENTION_FLOPS}


def _tensor_bytes(values) -> int:
    return sum(t.nbytes for t in tree_leaves(values) if isinstance(t, torch.Tensor))


class Roofline(TorchDispatchMode):
    """The FLOPs and bytes of each operator run inside it; `seconds` against a device."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[float, float]] = []  # (FLOPs, bytes) per operator

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.is_view:  # no data moves: a new header on the same storage
            return out
        formula = FORMULAS.get(func.overloadpacket)
        flops = formula(*args, **kwargs, out_val=out) if formula else 0
        moved = _tensor_bytes((args, kwargs)) + _tensor_bytes(out)
        self.ops.append((flops, moved))
        return out

    def restart(self) -> None:
        self.ops.clear()

    def seconds(self, peak_flops: float, bandwidth: float) -> float:
        """Each operator bound by its arithmetic or its memory traffic, in sequence."""
        return sum(max(flops / peak_flops, moved / bandwidth) for flops, moved in self.ops)

    def totals(self) -> tuple[float, float]:
        return sum(f for f, _ in self.ops), sum(b for _, b in self.ops)
