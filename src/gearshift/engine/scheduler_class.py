"""A scheduler class's lr schedule (`scheduler._target_`, a torch.optim.lr_scheduler class
or one's own), after the linear warm-up of `optimizer.lr_warmup_steps`. Loaded only where
`scheduler._target_` is set (engine/optim.py build_schedule); the built-in schedule warms up
within its own factor."""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig
from torch.optim.lr_scheduler import LRScheduler

from gearshift.config.instantiate import accepts, build, plain
from gearshift.config.rules import locate


def class_schedule(
    optimizer: torch.optim.Optimizer, target: str, scheduler: DictConfig, warmup: int,
    total_steps: int,
) -> LRScheduler | Warmup:  # fmt: skip
    """The class `target` names, built over `optimizer` with the scheduler node's other keys
    (and `total_steps`, the steps it schedules, where it takes one and the node gives none),
    behind a `Warmup` of `warmup` steps unless that is 0."""
    keywords = plain({k: v for k, v in scheduler.items() if k != "_target_"})
    if "total_steps" not in keywords and accepts(
        locate("scheduler._target_", target), "total_steps", by_name=True
    ):
        keywords["total_steps"] = max(1, total_steps - warmup)  # the steps it schedules
    schedule = build("scheduler", target, optimizer, keywords)
    return Warmup(optimizer, warmup, schedule) if warmup else schedule


class Warmup:
    """A linear warm-up of every group's lr over `steps` optimizer steps (step k: (k + 1) /
    steps of the group's peak, its initial_lr), then `schedule` from its own first step:
    the lr it set when built comes back, and each later step is its step."""

    def __init__(self, optimizer: torch.optim.Optimizer, steps: int, schedule: LRScheduler):
        self.optimizer, self.steps, self.schedule = optimizer, steps, schedule
        self.after = [group["lr"] for group in optimizer.param_groups]  # the schedule's first
        self.step_count = 0
        self._warm()

    def _warm(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] * (self.step_count + 1) / self.steps

    def step(self) -> None:
        self.step_count += 1
        if self.step_count < self.steps:
            self._warm()
        elif self.step_count == self.steps:  # a chained schedule goes on from its own lr
            for group, lr in zip(self.optimizer.param_groups, self.after, strict=True):
                group["lr"] = lr
        else:
            self.schedule.step()

    def state_dict(self) -> dict[str, Any]:
        return {"step_count": self.step_count, "schedule": self.schedule.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step_count = state["step_count"]
        self.schedule.load_state_dict(state["schedule"])
