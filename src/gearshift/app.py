"""The Hydra task (`run_task`) and `preflight`, the check of the command line before Hydra's:
it composes the config as Hydra will (once per swept value) and checks it, so that bad input
ends in one line before Hydra creates a run folder (docs/architecture.md, the data flow)."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra._internal.utils import get_args_parser
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from gearshift.config import ConfigError, check_config
from gearshift.config.rules import is_searchpath, locate
from gearshift.engine.failures import TrainingFailed
from gearshift.state import run_lock
from gearshift.state.checkpoint_folders import CheckpointError
from gearshift.state.preemption import TrainingStopped

# train.py's `fit(cfg, run_dir, run_name)`: trains, returns a result with the run's summary
Fit = Callable[[DictConfig, Path, "str | None"], Any]


def run_task(cfg: DictConfig, fit: Fit) -> float:
    """Hydra's task (train.py's `main`): check `cfg`, train with `fit` in this process or
    in `distributed.nproc_per_node` ranks, return the objective a sweeper optimises. Bad
    input, a failed run and a stop each end in one line and their exit code."""
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    run_name = hydra_cfg.job.override_dirname or None
    cfg.logger.group = wandb_group(cfg.logger.group, hydra_cfg)
    if job_rank() in (None, "0"):  # the job's other ranks share its lock
        try:
            run_lock.hold(run_dir)  # a second process here: one line, and it leaves the folder be
        except run_lock.RunFolderBusy as busy:
            _exit(str(busy))
    try:
        check_config(cfg)
        # fit raises ConfigError too, before its first step, when the data is unusable
        if cfg.distributed.nproc_per_node > 1 and "RANK" not in os.environ:
            from gearshift.local_ranks import launch_local

            summary = launch_local(fit, cfg, run_dir, run_name)  # the ranks run `fit`
        else:
            summary = fit(cfg, run_dir, run_name).summary
    except (ConfigError, CheckpointError, TrainingFailed, TrainingStopped) as error:
        from gearshift.run_endings import end_run  # a run that does not train to its end

        end_run(error, hydra_cfg, job_rank())
    finally:
        run_lock.release(run_dir)  # the next run of a sweep in this process may be here again
    return objective(summary)


def objective(summary: dict) -> float:
    """What a sweep optimises: the best value of the task's monitor metric (best/ checkpoint's), in
    the task's direction (`task_direction`); without validation data the final training
    loss, negated for a task whose mode is max so that the direction still holds."""
    best = summary.get("best") or {}
    if best.get("value") is not None:
        return best["value"]
    return -summary["final_loss"] if best.get("mode") == "max" else summary["final_loss"]


def task_direction(target: str) -> str:
    """Optuna's direction for the task `target` names: its monitor metric's mode.
    conf/hparams_search/ uses it as ${gearshift_task_direction:${task._target_}}."""
    mode = getattr(locate("task._target_", target), "mode", "min")
    return "maximize" if mode == "max" else "minimize"


OmegaConf.register_new_resolver("gearshift_task_direction", task_direction)


def default_config_dir() -> Path:
    """./conf when there is one, else the repository's conf/ (the entry points' default)."""
    here = Path.cwd() / "conf"
    return here if (here / "config.yaml").exists() else Path(__file__).resolve().parents[2] / "conf"


def wandb_group(configured: str | None, hydra_cfg: DictConfig) -> str | None:
    """logger.group when set; else a sweep's runs share one group, the sweep folder's name."""
    if configured is None and hydra_cfg.mode == RunMode.MULTIRUN:
        return Path(hydra_cfg.sweep.dir).name
    return configured


def _overrides_to_check(overrides: list[str]) -> list[tuple[list[str], str | None]]:
    """The override lists to compose: the fixed ones, then one per swept value (each with
    the override line it checks)."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    # Hydra's own keys are left to Hydra, but for the search path: it decides what composes
    fixed = [o for o in fixed if is_searchpath(o) or not o.lstrip("+~").startswith("hydra")]
    if not any(o.is_sweep_override() or _sweeper_key(o.key_or_group) for o in parsed):
        return [(fixed, None)]
    from gearshift.sweep_preflight import swept_variants  # a sweep, a search space

    return [(fixed, None), *swept_variants(parsed, fixed)]


def _sweeper_key(key: str) -> bool:
    """A key of the sweeper's (its search space's too), on the command line."""
    return key.lstrip("+~").startswith("hydra.sweeper.")


def preflight(config_dir: Path, config_name: str = "config", argv: list[str] | None = None) -> None:
    """Exit with one clear line if the command line would compose a bad config; on ranks
    other than 0 (torchrun, srun), point Hydra's own files away from the run folder.
    true/false given to a switch group become on/off in the command line itself (`argv`,
    else sys.argv), so Hydra composes and records `amp=on`."""
    command_line = sys.argv if argv is None else argv
    if argv is None and (rank := job_rank()) and rank != "0":
        from gearshift.argv_rewrites import hydra_output_elsewhere  # torchrun's, srun's ranks

        hydra_output_elsewhere(sys.argv, rank)
    # Hydra's own parser, as @hydra.main reads the command line: its flags, the overrides
    args = get_args_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.config_path is not None or args.config_dir is not None or args.experimental_rerun:
        return  # configs other than conf/'s: Hydra checks them
    config_name, overrides = args.config_name or config_name, args.overrides
    if any(word in o.lower() for o in overrides for word in ("true", "false")):  # Hydra's booleans
        from gearshift.argv_rewrites import reword_switches

        with initialize_config_dir(config_dir=str(config_dir.resolve()), version_base="1.3"):
            overrides = reword_switches(command_line, overrides, job_rank())
    if args.help or args.hydra_help or args.info or args.cfg:
        return  # Hydra prints: --cfg job amp=true shows amp=on's config
    try:
        variants = _overrides_to_check(overrides)
    except HydraException as error:
        from gearshift.run_endings import describe_error

        _exit(describe_error(error, None))
    with initialize_config_dir(config_dir=str(config_dir.resolve()), version_base="1.3"):
        planned = None
        for variant, swept in variants:
            try:
                cfg = compose(config_name, overrides=variant)
                check_config(cfg)
                planned = planned or cfg  # the fixed overrides' config: plan=on plans it
                _before_cuda_starts(cfg)
            except ConfigError as error:
                _exit(str(error))
            except (HydraException, OmegaConfBaseException) as error:
                from gearshift.run_endings import culprit, describe_error

                line = describe_error(error, swept or culprit(error, variant), variant)
                if swept:  # a swept value's config
                    from gearshift.sweep_preflight import naming_the_swept

                    line = naming_the_swept(swept, line)
                _exit(line)
        if problem := _output_folder_problem(config_name, overrides, args.multirun):
            _exit(problem)
    if any(_sweeper_key(o) for o in overrides):
        from gearshift.sweep_preflight import searched_on_hydra_key

        if line := searched_on_hydra_key(overrides):
            _exit(line)
    if planned is not None and planned.plan.enabled:
        from gearshift.run_endings import print_plan  # plan=on only

        print_plan(planned, job_rank())


def _before_cuda_starts(cfg: DictConfig) -> None:
    """deterministic needs CUBLAS_WORKSPACE_CONFIG before the process's first CUDA matmul:
    for a sweep run in this process, before its first run, which may not be deterministic."""
    if cfg.deterministic in (True, "warn"):
        from gearshift.engine.runtime import want_cublas_workspace  # loads torch: only then

        want_cublas_workspace(cfg.deterministic)


def _output_folder_problem(config_name: str, overrides: list[str], multirun: bool) -> str | None:
    """Why Hydra could not create the run (or sweep) folder, before it tries and fails with
    a traceback: a file where a folder must go, or a folder this user may not write in."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    hydra_keys = [o for o in overrides if o.lstrip("+~").startswith("hydra.")]
    try:
        folder = compose(config_name, overrides=hydra_keys, return_hydra_config=True)
        value = str(OmegaConf.select(folder, key))
        path = Path(value).absolute()
    except Exception:  # a folder named after values only a running job knows: Hydra decides
        return None
    existing = next(p for p in (path, *path.parents) if p.exists())  # the nearest one there
    if not existing.is_dir():
        return f"{key}={value!r} is not allowed; {existing} is a file, not a folder"
    if not multirun and (pid := run_lock.holder(path)) is not None:
        return str(run_lock.RunFolderBusy(path, pid))  # found before Hydra writes in it
    try:
        tempfile.TemporaryDirectory(dir=existing).cleanup()
    except OSError as error:
        reason = f"cannot create folders in {existing}: {error.strerror}"
        return f"{key}={value!r} is not allowed; {reason}"
    return None


def job_rank() -> str | None:
    """This process's rank in a job of several (torchrun's RANK, srun's SLURM_PROCID)."""
    return os.environ.get("RANK") or (
        os.environ.get("SLURM_PROCID") if int(os.environ.get("SLURM_NTASKS", "1")) > 1 else None
    )


def _exit(message: str) -> None:
    """One `error:` line and exit 2 (run_endings.py `refuse`)."""
    from gearshift.run_endings import refuse  # a refused command line only

    refuse(message, job_rank())
