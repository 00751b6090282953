"""The run's optimizers and their learning-rate schedules as one stateful thing
(`Optimizers`, built by `build_optimizers`), and gradient clipping. An optimizer class
(`optimizer._target_`), a scheduler class (`scheduler._target_`) and one's own schedule
(`optimizer.schedule`) plug in here: docs/make-it-yours.md."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeAlias

import torch
from omegaconf import DictConfig
from torch import nn
from torch.distributed.tensor import DTensor

from gearshift.config.instantiate import build, plain
from gearshift.config.rules import locate
from gearshift.config.schema import PRESET_CLASSES, SCHEDULE_FUNCTION, SCHEDULES, OptimizerConfig

if TYPE_CHECKING:
    from torch.optim.lr_scheduler import LRScheduler

    from gearshift.engine.scheduler_class import Warmup


def build_optimizers(
    model: nn.Module,
    optimizer_cfg: DictConfig,
    total_steps: int | None = None,
    fsdp: bool = False,
    scheduler: DictConfig | None = None,
) -> Optimizers:
    """The optimizers the optimizer node `optimizer_cfg` names over `model`'s parameters,
    each with the lr schedule of a run of `total_steps` (None: no schedules, for probes that take a
    step or two): the scheduler node's class, or (None, or its _target_ null) the built-in."""
    if OptimizerConfig.is_muon(optimizer_cfg):
        from gearshift.engine.muon import build_muon  # optimizer=muon only

        optimizers = build_muon(model, optimizer_cfg)
    else:
        optimizers = [one_optimizer(model, optimizer_cfg)]
    schedules = None
    if total_steps is not None:
        schedules = [build_schedule(o, optimizer_cfg, scheduler, total_steps) for o in optimizers]
    return Optimizers(model, optimizers, schedules, fsdp)


def build_schedule(
    optimizer: torch.optim.Optimizer, optimizer_cfg: DictConfig, scheduler: DictConfig | None,
    total_steps: int,
) -> Schedule:  # fmt: skip
    """`optimizer`'s lr schedule: the built-in's factor (warm-up included), or the scheduler
    node's class after the warm-up of optimizer.lr_warmup_steps."""
    target = None if scheduler is None else scheduler.get("_target_")
    if target is None:
        return Builtin(optimizer, schedule_factor(optimizer_cfg, total_steps))
    from gearshift.engine.scheduler_class import class_schedule  # scheduler._target_ only

    return class_schedule(optimizer, target, scheduler, optimizer_cfg.lr_warmup_steps, total_steps)


class Builtin:
    """The built-in schedule: every group's lr is its peak (initial_lr) times `factor(step)`,
    step 0 the first. LambdaLR's arithmetic and state (`last_epoch`, the steps taken) without
    its warning of a schedule stepped before optimizer.step(): the loop steps the schedule
    after every step, also one whose update was skipped (fp16's GradScaler, on_nonfinite=skip)."""

    def __init__(self, optimizer: torch.optim.Optimizer, factor: Callable[[int], float]):
        self.optimizer, self.factor, self.last_epoch = optimizer, factor, -1
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.step()  # to step 0's lr

    def step(self) -> None:
        self.last_epoch += 1
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] * self.factor(self.last_epoch)

    def state_dict(self) -> dict[str, Any]:
        return {"last_epoch": self.last_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """What `state_dict` saved, or a LambdaLR's (checkpoints written before): the same
        count. The lr itself comes back with the optimizer's state."""
        self.last_epoch = state["last_epoch"]


# a string: Warmup (engine/scheduler_class.py) loads only where build_schedule uses it
Schedule: TypeAlias = "LRScheduler | Builtin | Warmup"


def optimizer_label(optimizer_cfg: DictConfig) -> str:
    """gears.optimizer: the preset's name (sgd, adamw, muon) while its class is built, else
    the class named in its place."""
    target = OptimizerConfig.target(optimizer_cfg)
    name = optimizer_cfg.get("name")
    return name if name and PRESET_CLASSES.get(name) == target else target


def in_a_presets_place(optimizer_cfg: DictConfig) -> str | None:
    """The start's line for a class named in a preset's place, which takes the preset's
    keywords too (optimizer=sgd's momentum reaches RMSprop); None for a preset's own class."""
    target, preset = OptimizerConfig.target(optimizer_cfg), optimizer_cfg.get("name")
    if preset not in PRESET_CLASSES or target == PRESET_CLASSES[preset]:
        return None
    keywords = plain(OptimizerConfig.keywords(optimizer_cfg))
    given = ", ".join(f"{key}={value}" for key, value in keywords.items())
    return f"optimizer: {target} in optimizer={preset}'s place, with the keywords {given} (null: the class's default)"


def one_optimizer(model: nn.Module, optimizer_cfg: DictConfig) -> torch.optim.Optimizer:
    """The class `optimizer._target_` names, built as `cls(parameters, **keywords)`: the
    node's keys but the loop's (OptimizerConfig.keywords). The parameters are one group, or
    (weight_decay_1d=false) the decayed and the undecayed (engine/decay_groups.py); no
    weight_decay: the class's default."""
    keywords = plain(OptimizerConfig.keywords(optimizer_cfg))
    params = list(model.parameters())
    if not optimizer_cfg.weight_decay_1d:
        from gearshift.engine.decay_groups import decay_groups  # weight_decay_1d=false only

        decay = keywords.get("weight_decay")
        params = decay_groups(params, {} if decay is None else {"weight_decay": decay})
    return build("optimizer", OptimizerConfig.target(optimizer_cfg), params, keywords)


def clip_grad_norm(parameters: Iterable[nn.Parameter], max_norm: float | None) -> torch.Tensor:
    """The total L2 norm of all the model's gradients, left on the device (no host sync); with
    `max_norm`, gradients whose norm exceeds it are scaled down to it. Call it on true
    gradients (fp16: unscaled). Under DDP and FSDP, the norm over every rank's gradients, never
    its own shard's (docs/gears.md, "Gradient clipping")."""
    parameters = [p for p in parameters if p.grad is not None]
    total = torch.nn.utils.get_total_norm([p.grad for p in parameters])
    if isinstance(total, DTensor):  # FSDP: torch reduced the shards' norms, replicated
        total = total.full_tensor()  # a plain tensor, no further communication
    if max_norm is not None:
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total)
    return total


def schedule_factor(optimizer_cfg: DictConfig, total_steps: int) -> Callable[[int], float]:
    """The lr of step `step` (0: the first) as a multiple of the peak: a linear warm-up over
    `lr_warmup_steps`, then constant, cosine decay to zero at `total_steps`, or the factor
    of one's own function `optimizer.schedule` names: `factor(step, total_steps)`."""
    schedule = optimizer_cfg.schedule
    warmup, constant = optimizer_cfg.lr_warmup_steps, schedule == "constant"  # plain: per step
    after = None
    if schedule not in SCHEDULES:
        after = locate("optimizer.schedule", schedule, SCHEDULE_FUNCTION)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if after is not None:
            return float(after(step, total_steps))
        if constant:
            return 1.0
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


class Optimizers:
    """The run's optimizers as one stateful thing: the torch optimizers (one; optimizer=muon:
    Muon on the hidden matrices and AdamW on the rest), each with its lr schedule, which
    the loop steps, zeroes and schedules here (fp16: through engine/loss_scaling.py)."""

    sharded = True  # the checkpointer writes each rank's shards (state/checkpointer.py)

    def __init__(
        self,
        model: nn.Module,
        optimizers: list[torch.optim.Optimizer],
        schedules: list[Schedule] | None = None,
        fsdp: bool = False,
    ) -> None:
        """`model`: the module whose parameters they update (its parameter names key the
        state); `schedules`: one per optimizer, or None (probes that step twice)."""
        self.model, self.optimizers, self.fsdp = model, optimizers, fsdp
        self.schedules = schedules or []

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """Every optimizer's groups, the same dicts (what the schedules scale, and fp16's
        GradScaler reads of several optimizers as one)."""
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    def lr(self) -> float:
        """The first group's learning rate now, for the log (train/lr; under muon, Muon's)."""
        return self.optimizers[0].param_groups[0]["lr"]

    def step(self) -> None:
        """One update of every optimizer (fp16: what the GradScaler calls, once it found the
        gradients finite: engine/loss_scaling.py)."""
        for optimizer in self.optimizers:
            optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none)

    def step_schedules(self) -> None:
        """After each optimizer step, skipped or not: the lr of the next."""
        for schedule in self.schedules:
            schedule.step()

    def state_dict(self) -> dict[str, Any]:
        """{"state": by parameter name (torch.distributed.checkpoint's helpers: it loads
        resharded), "param_groups": ..., "schedules": [...]}; under FSDP this rank's shards.
        An optimizer without state yet saves none."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        state = get_optimizer_state_dict(self.model, self.optimizers)
        return state | {"schedules": [schedule.state_dict() for schedule in self.schedules]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """What `state_dict` saved (this rank's shards, or whole tensors), or an older single
        file's: one optimizer's torch state dict, keyed by position (engine/optim_loading.py)."""
        from gearshift.engine.optim_loading import load_optimizers_state  # resuming

        load_optimizers_state(self.model, self.optimizers, self.schedules, self.fsdp, state)
