"""`check_config`, before any work starts: each node's own checks (schema.py, targets.py;
feature_checks.py for a feature a run sets) and those that span nodes; the first value not
allowed raises a one-line ConfigError.
"""

from __future__ import annotations

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationKeyError

from gearshift.config import schema as s
from gearshift.config.rules import fail, locate
from gearshift.config.targets import check_arguments, check_data, check_types

# The parts of a run that check_config imports and checks: all of them for training and
# `evaluate`; `export` and `generate` use the model alone, so a task or source of the
# run's own package need not import where they run.
RUN_PARTS = frozenset({"model", "task", "data"})


def check_config(cfg: DictConfig, uses: frozenset[str] = RUN_PARTS) -> None:
    """Raise ConfigError (one line) for the first value that is not allowed, among the
    keys of the parts in `uses` and those every part reads."""
    for key, what in (("model", "model class or function"), ("task", "task class")):
        if key in uses:  # its class imports
            target = OmegaConf.select(cfg, f"{key}._target_")
            if not target:
                fail(f"{key}._target_", target, f"name the {what} to build")
            locate(f"{key}._target_", target)
    _check_unless_default(cfg, "amp")
    _check_unless_default(cfg, "compile")
    if cfg.logger.mode != "auto" or cfg.logger.tensorboard:  # W&B's mode named, TensorBoard
        _check_feature(cfg, "logger")
    s.Config.check_node(cfg)
    if cfg.get("max_tokens") is not None:  # a token budget
        _check_feature(cfg, "max_tokens")
    if cfg.model.get("init_from") is not None:  # the model's weights from a checkpoint
        _check_feature(cfg, "init_from")
    for key in ("batch_size_finder", "checkpoint", "sweep", "ema", "early_stop", "profile"):
        _check_unless_default(cfg, key)
    _check_unless_default(cfg, "plan")
    _check_unless_default(cfg, "distributed")  # several ranks
    if "data" in uses:
        _check_unless_default(cfg, "dataloader")
        check_types(cfg, "data")
        check_data(cfg)
        check_arguments(cfg, "data")
    _check_resolves(cfg, "model")  # after the data's own checks: they name its files
    if "task" in uses:
        _check_resolves(cfg, "task")
    for group in ("model", "task"):  # resolved now: the values, then the target's keywords
        if group in uses:
            check_types(cfg, group)
            check_arguments(cfg, group)
    if "block_size" in cfg.data or "vocab_size" in cfg.data:  # token data
        from gearshift.config.token_targets import check_model_takes_tokens

        check_model_takes_tokens(cfg)
    if "data" in uses:
        _check_unless_default(cfg, "device_transforms")
    s.OptimizerConfig.check_node(cfg.optimizer)
    if cfg.scheduler.get("_target_") is not None:  # a scheduler class; null: optimizer.schedule
        _check_feature(cfg, "scheduler")
    if cfg.device not in ("auto", "cpu"):  # a device named: one this machine has
        _check_feature(cfg, "device")


def _check_unless_default(cfg: DictConfig, key: str) -> None:
    """The node `key` of a feature a run may leave off, checked where it differs from its
    schema defaults (those pass)."""
    node = cfg[key]
    if node != OmegaConf.structured(OmegaConf.get_type(node)):
        _check_feature(cfg, key)


def _check_feature(cfg: DictConfig, name: str) -> None:
    """feature_checks.py's `check_<name>`: the module loads for a run that sets a feature."""
    locate(name, f"gearshift.config.feature_checks.check_{name}")(cfg)


def _check_resolves(cfg: DictConfig, group: str) -> None:
    """A model or task that reads a key the data lacks (model=gpt on image data) fails here,
    not with a traceback once the run folder exists."""
    for key, value in OmegaConf.to_container(cfg[group], resolve=False).items():
        try:
            node = OmegaConf.select(cfg, f"{group}.{key}", throw_on_missing=False)
            if isinstance(node, (DictConfig, ListConfig)):
                OmegaConf.to_container(node, resolve=True)
        except InterpolationKeyError as error:
            from gearshift.config.unknown_keys import fail_missing_key  # bad input only

            fail_missing_key(group, key, value, error)
