"""Weight averaging (`ema.*`): the average equals a hand-computed one, resumes exactly, is
validated and saved, costs no host read, and is refused under FSDP."""

from __future__ import annotations

import pytest
import torch
from helpers import SyncCounter, make_cfg
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from gearshift.config import ConfigError, check_config
from gearshift.engine.ema import EMA
from gearshift.state.checkpoint_folders import checkpoint_path, latest_checkpoint
from gearshift.state.checkpoint_reads import load_checkpoint
from train import fit

# simple_cnn has BatchNorm: running statistics (floats) and a counter (int64) to copy.
GEARS = ("model=simple_cnn", "model.width=8", "data.image_size=8", "max_steps=6")


class WeightRecorder:
    """The optimizer's parameters (in model order) before the first step and after each."""

    def __init__(self) -> None:
        self.before: dict[str, torch.Tensor] = {}
        self.after: list[dict[str, torch.Tensor]] = []

    def __enter__(self):
        def pre(optimizer, args, kwargs):
            if not self.before:
                self.before = self.snapshot(optimizer)

        def post(optimizer, args, kwargs):
            self.after.append(self.snapshot(optimizer))

        self.handles = [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]  # fmt: skip
        return self

    @staticmethod
    def snapshot(optimizer) -> dict[str, torch.Tensor]:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        return {str(i): p.detach().double().clone() for i, p in enumerate(params)}

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()


def test_the_average_after_n_steps_equals_a_hand_computed_one(tmp_path):
    decay = 0.75
    # start_step=2, every 2 steps: the average copies step 1's weights, then folds in
    # steps 2, 4 and 6 (3 and 5 are skipped)
    cfg = make_cfg(*GEARS, f"ema.decay={decay}", "ema.start_step=2", "ema.every_n_steps=2")
    with WeightRecorder() as weights:
        result = fit(cfg, tmp_path)
    assert len(weights.after) == 6
    reference = dict(weights.after[0])  # step 1 < start_step: a copy
    for step in (2, 4, 6):
        reference = {
            k: decay * reference[k] + (1 - decay) * w for k, w in weights.after[step - 1].items()
        }
    saved = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))
    assert saved["position"]["step"] == 6
    live, average = result.model.state_dict(), saved["ema"]
    assert average.keys() == live.keys()  # beside the weights, with the same keys
    parameters = [name for name, _ in result.model.named_parameters()]
    for index, name in enumerate(parameters):
        # float32 lerps against a float64 reference: a few float32 ulps of the weights
        torch.testing.assert_close(average[name].double(), reference[str(index)], rtol=0, atol=1e-6)
        assert not torch.equal(average[name], live[name]), name  # it does average
    for name, buffer in result.model.named_buffers():
        assert torch.equal(average[name], buffer), name  # buffers are copied as they are
    assert average["1.num_batches_tracked"].dtype == torch.int64
    ema = result.summary["ema"]
    assert ema["decay"] == decay and 0 <= ema["val_accuracy"] <= 1 and ema["val_loss"] > 0
    assert ema["val_loss"] != result.summary["val_loss"]  # the average was validated itself


def test_a_resumed_average_equals_an_uninterrupted_one(tmp_path):
    gears = (*GEARS, "max_steps=8", "ema.decay=0.9", "val_every_n_steps=2")
    cfg = make_cfg(*gears, "checkpoint.every_n_steps=4", "checkpoint.keep=5")
    fit(cfg, tmp_path / "whole")
    halfway = checkpoint_path(tmp_path / "whole" / "checkpoints", 4)
    fit(make_cfg(*gears, f"resume={halfway}"), tmp_path / "resumed")
    whole = load_checkpoint(latest_checkpoint(tmp_path / "whole" / "checkpoints"))
    resumed = load_checkpoint(latest_checkpoint(tmp_path / "resumed" / "checkpoints"))
    assert resumed["position"] == whole["position"]
    for name, tensor in whole["ema"].items():
        assert torch.equal(resumed["ema"][name], tensor), name
    assert resumed["best"] == whole["best"]  # the best-so-far tracker resumes too


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)], ids=["cpu", "cuda"]
)
def test_the_average_adds_no_host_read_to_the_loop(tmp_path, monkeypatch, device):
    cfg = make_cfg(
        f"device={device}", "model=mlp", "max_steps=20", "log_every_n_steps=10",
        "warmup_steps=5", "ema.decay=0.9",
    )  # fmt: skip
    reads = SyncCounter(monkeypatch, cuda_only=device == "cuda")
    during_updates = []

    def update(ema, step, _update=EMA.update):
        before = reads.count
        _update(ema, step)
        during_updates.append(reads.count - before)

    monkeypatch.setattr(EMA, "update", update)
    result = fit(cfg, tmp_path)
    assert during_updates == [0] * 20  # every step's update, none reading the device
    if device == "cpu":  # every read counts here
        # 3 loss reads at log steps; validation of the model and of the average; the finite
        # check of best/ (the final checkpoint, at the same step, is that file)
        assert reads.count == 3 + 2 + 1
    assert result.summary["ema"]["val_loss"] != result.summary["val_loss"]


def test_the_average_is_refused_under_fsdp_in_one_line():
    cfg = make_cfg("ema.decay=0.99", "distributed=fsdp", "distributed.nproc_per_node=2")
    with pytest.raises(ConfigError) as error:
        check_config(cfg)
    assert str(error.value) == (
        "ema.decay=0.99 is not allowed; weight averaging does not shard its copy under "
        "distributed=fsdp; use distributed=ddp or ema.decay=null"
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("ema.decay=1.0", "ema.decay=1.0 is not allowed; expected a number > 0 and < 1"),
        ("ema.every_n_steps=0", "ema.every_n_steps=0 is not allowed; expected an integer >= 1"),
    ],
)
def test_bad_averaging_values_are_one_line(override, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(")):
        check_config(make_cfg(override))
