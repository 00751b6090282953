"""The planner (observe/plan.py) asked about the run build.py builds: batch_size=auto's
first trial on CUDA (`planner`), and plan.check=true's plan with, on a CPU, a real step's
tensor bytes to hold it against (`check_plan`). Like the builder, it reads the root config.
Loaded only where one of them is configured.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from omegaconf import DictConfig, OmegaConf

from gearshift.parallel.distributed import Ranks
from gearshift.tasks import Task

if TYPE_CHECKING:
    from gearshift.observe.plan import PlanCheck


def planner(cfg: DictConfig, task: Task) -> Callable[[int], int | None]:
    """batch_size=auto's first trial on CUDA: the largest batch the plan of `cfg` on one
    device (observe/plan.py) fits in a number of bytes."""

    def largest(memory: int) -> int | None:
        from gearshift.observe.plan import make_plan

        single = OmegaConf.merge(cfg, {"plan": {"device": "auto", "world_size": 1}})
        return make_plan(single, task, budget=memory).largest_batch_size

    return largest


def check_plan(
    cfg: DictConfig, batch_size: int, task: Task, device: torch.device,
    amp_dtype: torch.dtype | None, memory_format: torch.memory_format, ranks: Ranks,
) -> PlanCheck:  # fmt: skip
    """plan.check=true: this run's plan (its device, its ranks, its batch size: the config's
    or batch_size=auto's find) and, on a CPU, the tensor bytes of a tracked real step to
    hold it against (CUDA: the run's own peak, at the end)."""
    from gearshift.batch_finder import tracked_step_peak
    from gearshift.observe.plan import PlanCheck, log_plan, make_plan

    this_run = {"batch_size": batch_size, "plan": {"device": "auto", "world_size": ranks.world_size}}  # fmt: skip
    cfg = OmegaConf.merge(cfg, this_run)
    plan = make_plan(cfg, task)
    if ranks.is_zero:
        log_plan(plan)
    measured = None
    if device.type == "cpu":
        measured = tracked_step_peak(
            cfg.model, cfg.optimizer, cfg.batch_size, task, amp_dtype, memory_format
        )
    return PlanCheck(plan, measured)
