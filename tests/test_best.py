"""best/, early stopping and the search objective: the task's monitor metric decides."""

from __future__ import annotations

import torch
from helpers import make_cfg
from torch.optim.optimizer import register_optimizer_step_post_hook
from torchmetrics import Metric

from gearshift.app import objective
from gearshift.state.best import BestTracker
from gearshift.state.checkpoint_reads import load_checkpoint
from gearshift.state.checkpointer import ModelState
from gearshift.tasks import Classification
from train import fit


class ScriptedAccuracy(Classification):
    """Classification whose val_accuracy is `script`, one value per validation, so a test
    decides when the metric goes up and down."""

    def __init__(self, num_classes: int, input_shape: list[int], script: list[float]) -> None:
        super().__init__(num_classes, input_shape)
        self.script, self.validations = list(script), 0

    def val_metrics(self) -> dict[str, Metric]:
        return {**super().val_metrics(), "accuracy": Scripted(self)}


class Scripted(Metric):
    """The task's script, one value per validation (the start's check computes a copy)."""

    def __init__(self, task: ScriptedAccuracy) -> None:
        super().__init__()
        self.task = task

    def update(self, predictions, targets) -> None:
        pass

    def compute(self) -> torch.Tensor:
        value = self.task.script[self.task.validations]
        self.task.validations += 1
        return torch.tensor(value, dtype=torch.float64)


def scripted(*script: float) -> tuple[str, ...]:
    values = ",".join(map(str, script))
    return ("model=mlp", f"task._target_={__name__}.ScriptedAccuracy", f"+task.script=[{values}]")


class ParameterSnapshots:
    """The parameters after each optimizer step (step n at index n - 1)."""

    def __enter__(self):
        self.steps: list[list[torch.Tensor]] = []

        def hook(optimizer, args, kwargs):
            params = [p for group in optimizer.param_groups for p in group["params"]]
            self.steps.append([p.detach().clone() for p in params])

        self.handle = register_optimizer_step_post_hook(hook)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def test_best_holds_the_step_of_the_best_validation(tmp_path):
    # validations at steps 2, 4, ..., 10; accuracy (mode max) peaks at step 8
    cfg = make_cfg(
        *scripted(0.3, 0.7, 0.5, 0.9, 0.4),
        "max_steps=10",
        "val_every_n_steps=2",
        "checkpoint.every_n_steps=2",
        "checkpoint.keep=1",  # rotation of step checkpoints never deletes best/
    )
    with ParameterSnapshots() as snapshots:
        result = fit(cfg, tmp_path)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["best", "step_000000010"]
    best = load_checkpoint(tmp_path / "checkpoints" / "best")
    assert best["position"]["step"] == 8
    assert best["best"]["value"] == 0.9 and best["best"]["step"] == 8
    parameters = [name for name, _ in result.model.named_parameters()]
    for name, at_step_8 in zip(parameters, snapshots.steps[8 - 1], strict=True):
        assert torch.equal(best["model"][name], at_step_8), name  # step 8's weights
        assert not torch.equal(best["model"][name], result.model.state_dict()[name]), name
    summary = result.summary
    assert summary["best"] == {
        "metric": "val_accuracy",
        "mode": "max",
        "step": 8,
        "value": 0.9,
        "checkpoint": "checkpoints/best",
    }
    assert summary["val_accuracy"] == 0.4 and summary["stop_reason"] == "completed"
    assert objective(summary) == 0.9  # what a sweep optimises: the best, not the last


def test_a_checkpoint_at_a_best_validation_reuses_best(tmp_path, monkeypatch):
    gathered = []
    state = ModelState.state_dict
    monkeypatch.setattr(ModelState, "state_dict", lambda self: gathered.append(1) or state(self))
    cfg = make_cfg(
        *scripted(0.3, 0.7, 0.5, 0.9, 0.4),
        "max_steps=10",
        "val_every_n_steps=2",
        "checkpoint.every_n_steps=2",
        "checkpoint.keep=5",
    )
    fit(cfg, tmp_path)
    # steps 2, 4, 6, 8 and 10 each took the model's state once, though 2, 4 and 8 also
    # wrote best/: step 8's checkpoint is best/'s files, hard links
    assert len(gathered) == 5
    folder = tmp_path / "checkpoints"
    best = sorted((p.name, p.stat().st_ino) for p in (folder / "best").iterdir())
    assert sorted((p.name, p.stat().st_ino) for p in (folder / "step_000000008").iterdir()) == best
    assert (folder / "step_000000004" / ".metadata").stat().st_nlink == 1  # its own, older best
    assert load_checkpoint(folder / "step_000000004")["position"]["step"] == 4
    assert load_checkpoint(folder / "step_000000008")["position"]["step"] == 8


def test_early_stopping_ends_at_the_expected_validation(tmp_path):
    # best at step 4 (0.7); steps 6 and 8 do not improve on it: patience 2 ends at step 8
    cfg = make_cfg(
        *scripted(0.3, 0.7, 0.6, 0.65, 0.9, 0.95),
        "max_steps=20",
        "val_every_n_steps=2",
        "early_stop.patience=2",
    )
    result = fit(cfg, tmp_path)
    summary = result.summary
    assert summary["steps"] == 8 and summary["stop_reason"] == "early_stop"
    assert summary["val_accuracy"] == 0.65  # the 4th validation was the last one
    assert summary["best"]["step"] == 4 and summary["best"]["value"] == 0.7
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["best", "step_000000008"]  # a final checkpoint, at the stop
    final = load_checkpoint(tmp_path / "checkpoints" / "step_000000008")
    assert final["best"]["bad_validations"] == 2
    again = fit(cfg, tmp_path)  # a rerun of the stopped run trains nothing more
    assert again.summary == summary


def test_min_delta_and_patience_count_validations_without_improvement():
    tracker = BestTracker("val_loss", "min", min_delta=0.1, patience=2)
    assert tracker.update(1.0, step=1)  # the first value is the best so far
    assert not tracker.update(0.95, step=2)  # better, but not by more than min_delta
    assert not tracker.should_stop
    assert tracker.update(0.85, step=3) and tracker.bad_validations == 0
    assert not tracker.update(float("nan"), step=4)  # a NaN never improves
    assert not tracker.update(2.0, step=5)
    assert tracker.should_stop and (tracker.step, tracker.value) == (3, 0.85)


def test_without_validation_there_is_no_best_and_the_objective_is_the_loss(tmp_path):
    result = fit(make_cfg("model=mlp", "max_steps=2", "data.num_val_samples=0"), tmp_path)
    assert result.summary["best"]["step"] is None
    assert not (tmp_path / "checkpoints" / "best").exists()
    # classification's mode is max: the loss is negated, so maximising it still helps
    assert objective(result.summary) == -result.summary["final_loss"]
