"""The Task seam and train.py's loop: a second task trains through the same loop, the loop
takes its windows of micro-batches, and a target that is not a Task is one clear line."""

from __future__ import annotations

import pytest
import torch
from helpers import make_cfg, record_logs, task_of
from torch.optim.optimizer import register_optimizer_step_post_hook

import train
from gearshift.config import ConfigError
from gearshift.data_batches import data_batches
from gearshift.parallel.distributed import grad_sync
from gearshift.tasks import Regression
from train import fit

CPU = torch.device("cpu")


def regression_cfg(*overrides: str):
    # 48 inputs and 1024 samples: enough data per input for a linear target to generalise
    return make_cfg(
        "experiment=regression", "data.image_size=4", "data.num_samples=1024", *overrides
    )


def test_regression_learns_its_targets_through_the_unchanged_loop(tmp_path):
    cfg = regression_cfg("max_steps=60", "optimizer=adamw", "optimizer.lr=0.003")
    task = task_of(cfg)
    assert isinstance(task, Regression) and task.monitor == "val_loss" and task.mode == "min"
    _, val = data_batches(cfg, CPU)
    targets = torch.cat([y for _, y in val])
    baseline = targets.var(dim=0, unbiased=False).mean().item()  # MSE of predicting the mean

    summary = fit(cfg, tmp_path).summary
    assert summary["val_loss"] < 0.2 * baseline, (summary["val_loss"], baseline)
    assert summary["val_mae"] > 0 and "val_accuracy" not in summary
    assert summary["flops_per_sample"] > 0  # counted on the task's example batch
    assert summary["samples"] == 60 * cfg.batch_size


def test_regression_without_validation_data_reports_nulls(tmp_path):
    summary = fit(regression_cfg("max_steps=2", "data.num_val_samples=0"), tmp_path).summary
    assert summary["val_loss"] is None and summary["val_mae"] is None


def test_the_loop_takes_accum_micro_batches_a_step_and_syncs_gradients_on_the_last(
    tmp_path, monkeypatch
):
    synced: list[bool] = []

    def recording_sync(model, enabled):
        synced.append(enabled)
        return grad_sync(model, enabled)

    monkeypatch.setattr(train, "grad_sync", recording_sync)
    logged = record_logs(monkeypatch)
    steps = []
    hook = register_optimizer_step_post_hook(lambda optimizer, args, kwargs: steps.append(1))
    try:
        cfg = make_cfg(
            "model=mlp", "max_steps=4", "accum=2", "log_every_n_steps=2", "warmup_steps=0"
        )
        summary = fit(cfg, tmp_path).summary
    finally:
        hook.remove()
    assert len(steps) == summary["steps"] == 4
    assert synced == [False, True] * 4  # one all-reduce per window: on its last micro-batch
    train_logs = [
        step for step, metrics in zip(logged.steps, logged, strict=True) if "train/loss" in metrics
    ]
    assert train_logs == [2, 4]
    assert any("val/accuracy" in metrics for metrics in logged)


class NotATask:
    def __init__(self, num_classes: int, input_shape: list[int]) -> None:
        pass


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            (f"task._target_={__name__}.NotATask",),
            f"task._target_='{__name__}.NotATask' is not allowed; it built a NotATask, "
            "expected a subclass of gearshift.tasks.Task",
        ),
        (
            ("task._target_=gearshift.tasks.Regression",),
            "task._target_='gearshift.tasks.Regression' is not allowed; "
            "missing a required argument: 'num_outputs'",
        ),
    ],
)
def test_a_task_that_cannot_be_built_is_one_line(overrides, message):
    with pytest.raises(ConfigError) as error:
        task_of(make_cfg(*overrides))
    assert str(error.value) == message


class Returns(Regression):
    """A regression whose loss returns what it is given."""

    def __init__(self, value) -> None:
        super().__init__(num_outputs=1, input_shape=[1])
        self.value = value

    def loss(self, model, batch):
        return self.value


LOSS = torch.tensor(1.0)
EXPECTED = "expected a scalar tensor or (loss, {name: scalar tensor})"


@pytest.mark.parametrize(
    ("value", "wrong"),
    [
        (1.0, f"a float, {EXPECTED}"),
        (torch.ones(2), f"a tensor of shape [2], {EXPECTED}"),
        ((LOSS, [LOSS]), f"(loss, a list), {EXPECTED}"),
        ((LOSS, {"aux": 0.5}), f"the term 'aux' as a float, {EXPECTED}"),
        (
            (LOSS, {"lr": LOSS}),
            "a term named 'lr'; the trainer logs train/ loss, lr, grad_norm, "
            "nonfinite_skipped_steps itself: rename it",
        ),
    ],
    ids=["float", "vector", "not-a-dict", "float-term", "trainer-name"],
)
def test_a_loss_the_trainer_cannot_log_is_one_line(value, wrong):
    with pytest.raises(ConfigError) as error:
        Returns(value).loss_terms(None, None)
    assert (
        str(error.value)
        == f"task._target_='{__name__}.Returns' is not allowed; its loss returned {wrong}"
    )


def test_a_loss_alone_or_with_terms_is_the_loss_and_its_terms():
    aux = torch.tensor(2.0)
    assert Returns(LOSS).loss_terms(None, None) == (LOSS, {})
    assert Returns((LOSS, {"aux": aux})).loss_terms(None, None) == (LOSS, {"aux": aux})
