"""Gradient clipping (optimizer.clip_grad_norm) and train/grad_norm, against a hand computation."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from helpers import make_cfg, record_logs, task_of
from torch.optim.optimizer import register_optimizer_step_pre_hook

from train import fit

LR = 0.1
# SGD without momentum or weight decay and a constant lr: the one step is -LR x the gradient
PLAIN_SGD = (
    "optimizer.lr=0.1",
    "optimizer.momentum=0",
    "optimizer.weight_decay=0",
    "optimizer.schedule=constant",
)


class Recorded:
    """What one training step saw: its batch, the parameters before the update, the logs."""

    def __init__(self, monkeypatch, cfg) -> None:
        self.batches, self.params = [], []
        task_class = type(task_of(cfg))
        loss = task_class.loss

        def recording_loss(task, model, batch):
            inputs, targets = batch
            self.batches.append((inputs.detach().clone(), targets.clone()))
            return loss(task, model, batch)

        monkeypatch.setattr(task_class, "loss", recording_loss)
        self.logs = record_logs(monkeypatch)

        def hook(optimizer, args, kwargs):  # runs only for a step that is taken
            groups = optimizer.param_groups  # matrices and 1-D parameters may be apart
            self.params.append({p: p.detach().clone() for g in groups for p in g["params"]})

        self.handle = register_optimizer_step_pre_hook(hook)

    def remove(self) -> None:
        self.handle.remove()


def hand_step(cfg, trained: torch.nn.Module, before, batches, dtype, max_norm):
    """The one step worked out by hand: the true (unscaled) gradient of the window's mean
    loss at the parameters before the step, its total norm, and SGD's update with it
    clipped."""
    model = copy.deepcopy(trained)
    with torch.no_grad():
        for p, p0 in zip(model.parameters(), before, strict=True):
            p.copy_(p0)
    for inputs, targets in batches:
        with torch.autocast(inputs.device.type, dtype=dtype, enabled=dtype is not None):
            loss = task_of(cfg).loss(model, (inputs, targets))
        (loss / len(batches)).backward()
    grads = [p.grad for p in model.parameters()]
    norm = math.sqrt(sum(float(g.double().square().sum()) for g in grads))
    coef = min(1.0, max_norm / (norm + 1e-6)) if max_norm is not None else 1.0
    return norm, [p0 - LR * coef * g for p0, g in zip(before, grads, strict=True)]


FP16 = ("amp=fp16", torch.float16)


@pytest.mark.parametrize(
    ("gears", "dtype", "max_norm"),
    [
        (("amp=off",), None, None),
        (("amp=off",), None, 0.05),
        (("amp=off", "accum=2"), None, 0.05),  # clipped once, the window's summed gradient
        (FP16[:1], FP16[1], 0.05),
        # the fused step takes the GradScaler's scale itself, unless unscale_ came first
        ((FP16[0], "optimizer.fused=true"), FP16[1], 0.05),
        pytest.param(
            ("device=cuda", FP16[0], "optimizer.fused=true"), FP16[1], 0.05, marks=pytest.mark.gpu
        ),
    ],
    ids=[
        "fp32",
        "fp32-clipped",
        "fp32-accum2-clipped",
        "fp16-clipped",
        "fp16-fused-clipped",
        "cuda-fp16-fused-clipped",
    ],
)
def test_one_step_is_the_hand_computed_clipped_update(
    tmp_path, monkeypatch, gears, dtype, max_norm
):
    clip = f"optimizer.clip_grad_norm={max_norm}" if max_norm else "optimizer.clip_grad_norm=null"
    cfg = make_cfg("model=mlp", "model.hidden=32", *gears, "max_steps=1", *PLAIN_SGD, clip)
    seen = Recorded(monkeypatch, cfg)
    try:
        result = fit(cfg, tmp_path)
    finally:
        seen.remove()
    assert len(seen.params) == 1  # one step, taken (under fp16: not skipped)
    before = [seen.params[0][p] for p in result.model.parameters()]
    # the last losses are the window's (the FLOP count computes one before, on a dummy batch)
    window = seen.batches[-cfg.accum :]
    norm, expected = hand_step(cfg, result.model, before, window, dtype, max_norm)
    if max_norm is not None:
        assert norm > 10 * max_norm  # the threshold binds: the update is really scaled down
    # The logged norm is the true gradient's: under fp16 a norm of the still-scaled gradients
    # would be 65536x (the GradScaler's first scale) larger.
    (logged,) = [m["train/grad_norm"] for m in seen.logs if "train/grad_norm" in m]
    rtol = 1e-2 if dtype else 1e-4  # fp16: the scaled backward rounds differently
    assert logged == pytest.approx(norm, rel=rtol)
    for p, want, p0 in zip(result.model.parameters(), expected, before, strict=True):
        # Compared as updates (an unscaled-then-clipped fp16 step would be 65536x too small),
        # up to rounding: of the subtraction in float32, and of fp16's scaled backward.
        update = want - p0
        atol = rtol * float(update.abs().max())
        torch.testing.assert_close(p.detach() - p0, update, rtol=rtol, atol=atol)
