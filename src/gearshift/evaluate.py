"""Validation of a checkpoint without training: `python -m gearshift.evaluate resume=PATH`.

    python -m gearshift.evaluate resume=runs/my-run/checkpoints/best
    python -m gearshift.evaluate resume=runs/my-run/checkpoints/step_000001000 amp=bf16

The config is the checkpoint's own (the run's resolved config) with the overrides on top:
a group override (`amp=bf16`, `model=mlp`) replaces that node, a key (`batch_size=256`)
that key, an experiment or gear preset the keys it changes. What validation needs is
built from it as the training run built it (build.py `build_parts`: the same data,
precision, memory format, device transforms; no optimizer, no profiler, no advisor), the
checkpoint's weights are loaded, and the task's validation runs once, for the weight
average too when the checkpoint holds one (`ema.decay`). The metrics go to `eval.json` in the checkpoint's run
folder (the folder above `checkpoints/`; for a checkpoint elsewhere, its own folder), or
to `--output`. One process: `distributed` is set to none.

A checkpoint of another model or task, or a bad value, ends with one `error:` line and
exit 2, as with train.py, and writes nothing.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from torch import nn

from gearshift.app import default_config_dir
from gearshift.build import build_parts
from gearshift.config import ConfigError, check_config
from gearshift.config.checks import RUN_PARTS
from gearshift.config.schema import Config
from gearshift.engine.ema import build_ema
from gearshift.engine.runtime import resolve_device
from gearshift.models.factory import build_model, memory_layout
from gearshift.observe.summary import write_json_atomic
from gearshift.parallel.distributed import Ranks
from gearshift.run_endings import EXIT_BAD_CONFIG, culprit, describe_error
from gearshift.state.checkpoint_folders import CheckpointError
from gearshift.state.checkpoint_reads import Saved, load_checkpoint
from gearshift.state.checkpointer import ModelState
from gearshift.state.restore import load_parts
from gearshift.tasks.metrics import ValidationFailed

log = logging.getLogger("gearshift.evaluate")


def split_resume(overrides: list[str]) -> tuple[Path, list[str]]:
    """The checkpoint (`resume=PATH`) and the other overrides."""
    paths = [o.split("=", 1)[1] for o in overrides if o.startswith("resume=")]
    rest = [o for o in overrides if not o.startswith("resume=")]
    if not paths or paths[-1] in ("", "null", "auto"):
        value = paths[-1] if paths else None
        raise ConfigError(f"resume={value!r} is not allowed; give the checkpoint: resume=PATH")
    if not Path(paths[-1]).exists():
        raise ConfigError(f"resume={paths[-1]!r} is not allowed; no such checkpoint file")
    return Path(paths[-1]), rest


def changed_leaves(before: Any, after: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two plain config trees."""
    if isinstance(before, dict) and isinstance(after, dict):
        keys = sorted(before.keys() | after.keys())
        return [k for key in keys for k in changed_leaves(before.get(key), after.get(key), f"{prefix}{key}.")]  # fmt: skip
    return [] if before == after else [prefix.rstrip(".")]


def evaluation_config(saved: dict, overrides: list[str], config_dir: Path) -> DictConfig:
    """The checkpoint's config with the overrides applied as train.py would apply them."""
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(Config), saved)  # keys added since: defaults
    except OmegaConfBaseException as error:
        raise ConfigError(f"the checkpoint's config does not fit this version: {error}") from None
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        plain = OmegaConf.to_container(compose("config"), resolve=False)
        try:
            given_cfg = compose("config", overrides=overrides)
        except (HydraException, OmegaConfBaseException) as error:  # amp=onn: one line
            raise ConfigError(describe_error(error, culprit(error, overrides), overrides)) from None
    given = OmegaConf.to_container(given_cfg, resolve=False)  # interpolations resolve in cfg
    for override in OverridesParser.create().parse_overrides(overrides):
        if override.is_sweep_override():
            raise ConfigError(f"{override.input_line} is not allowed; evaluate takes one value")
        key = override.key_or_group
        if (config_dir / key).is_dir() and key not in given:  # a preset at the top level
            keys = changed_leaves(plain, given)
        else:  # a node of its own (amp=bf16: the whole amp node) or one key
            keys = [key]
        for dotted in keys:
            node: Any = given
            for part in dotted.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            existing = OmegaConf.select(cfg, dotted)
            typed = OmegaConf.is_dict(existing) and OmegaConf.get_type(existing) is not dict
            # a typed node (logger, amp) takes the new values key by key; a plain one (model,
            # data, task) is replaced whole, so no key of the old option is left over
            OmegaConf.update(cfg, dotted, node, merge=typed, force_add=True)
    cfg.resume = None  # the weights are loaded below, not a training state
    if "init_from" in cfg.model:
        cfg.model.init_from = None  # the checkpoint's weights replace any start
    cfg.distributed.strategy, cfg.distributed.nproc_per_node = "none", 1
    return cfg


def output_path(checkpoint: Path) -> Path:
    folder = checkpoint.parent
    return (folder.parent if folder.name == "checkpoints" else folder) / "eval.json"


def evaluate_checkpoint(path: Path, overrides: list[str], config_dir: Path) -> dict[str, Any]:
    """Validate the checkpoint at `path` under its config and `overrides`; eval.json's dict."""
    checkpoint = load_checkpoint(path, parts=("model", "ema"))
    cfg = evaluation_config(checkpoint["config"], overrides, config_dir)
    trained_for, now = checkpoint["config"]["task"]["_target_"], cfg.task._target_
    if trained_for != now:  # before the checks: another task's keys need not fit this data
        raise CheckpointError(
            f"resume={str(path)!r}: the checkpoint was trained for another task "
            f"({trained_for}), not {now}"
        )
    saved = Saved(path, checkpoint)
    if cfg.batch_size == "auto":  # the size the run found, not a search of its own
        cfg.batch_size = saved.decisions.get("batch_size", "auto")
    check_config(cfg, uses=RUN_PARTS)
    device = resolve_device(cfg.device)
    parts = build_parts(cfg, Ranks(), "none", device)
    if parts.val_batches is None:
        raise ConfigError(
            f"resume={str(path)!r} is not allowed; its data has no validation set: "
            "add one with overrides (e.g. data.num_val_samples=N)"
        )
    load_parts(saved, {"model": ModelState(parts.model)})
    metrics = parts.validation_metrics(parts.model)
    ema_metrics = None
    if parts.ema is not None and "ema" in checkpoint:
        load_parts(saved, {"ema": parts.ema})
        ema_metrics = parts.validation_metrics(parts.ema.model)
    return {
        "checkpoint": str(path.resolve()),
        "step": checkpoint["position"]["step"],
        "overrides": overrides,
        "device": str(device),
        "metrics": metrics,
        "ema_metrics": ema_metrics,
        "gears": dict(parts.gears),
    }


def load_model(
    path: Path, overrides: list[str], config_dir: Path, raw: bool = False
) -> tuple[nn.Module, DictConfig]:
    """The checkpoint's model (its weight average unless `raw`), built from its config and
    `overrides` as training built it, on its device in eval mode; and that config. Only
    the model is built (for export and generate): not the task or data."""
    checkpoint = load_checkpoint(path, parts=("model", "ema"))
    cfg = evaluation_config(checkpoint["config"], overrides, config_dir)
    cfg.model.checkpointing = False  # a gear of training; the model is used as it is
    check_config(cfg, uses=frozenset({"model"}))
    device = resolve_device(cfg.device)
    model = build_model(cfg.model, device, memory_layout(cfg.memory_format.channels_last))
    ema = build_ema(cfg.ema, model)
    saved = Saved(path, checkpoint)
    load_parts(saved, {"model": ModelState(model)})
    if not raw and ema is not None and checkpoint.get("ema") is not None:
        load_parts(saved, {"ema": ema})
        model = ema.model
        log.info("the weight average (ema.decay); --raw: the trained weights")
    return model.eval(), cfg


# What a command line can get wrong: a value, a checkpoint, an override that does not parse.
BAD_INPUT = (ConfigError, CheckpointError, HydraException, OmegaConfBaseException)


def bad_input(error: Exception) -> int:
    """One `error:` line on stderr for bad input; the exit code to return (2)."""
    message = (
        error if isinstance(error, ConfigError | CheckpointError) else describe_error(error, None)
    )
    print(f"error: {message}", file=sys.stderr)
    return EXIT_BAD_CONFIG


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-dir", type=Path, default=None, help="default: ./conf")
    parser.add_argument("--output", type=Path, default=None, help="default: <run folder>/eval.json")
    parser.add_argument("overrides", nargs="*", help="resume=PATH and config overrides")
    args = parser.parse_args(argv)
    config_dir = (args.config_dir or default_config_dir()).resolve()
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        path, overrides = split_resume(args.overrides)
        result = evaluate_checkpoint(path, overrides, config_dir)
    except BAD_INPUT as error:
        return bad_input(error)
    except ValidationFailed as failed:  # the task's or a metric's own code raised
        print(f"error: validation of {path}: {failed}", file=sys.stderr)
        return 1
    output = args.output or output_path(path)
    write_json_atomic(output, result)
    log.info("%s at step %d: %s -> %s", path, result["step"], result["metrics"], output)
    if result["ema_metrics"] is not None:
        log.info("weight average: %s", result["ema_metrics"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
