"""How run_task and preflight end a run that does not train to its end, beside its one
line: a refused command line's `error:` line and exit 2 (Hydra's and OmegaConf's errors in
one line), plan=on's plan and exit 0, a failed run's line and exit 1, a stopped run's line
naming the command that resumes it, and a run refused before its first step leaving no run
folder behind. Loaded only then.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.types import IntervalSweep, Override
from hydra.errors import MissingConfigException
from hydra.types import RunMode
from omegaconf import DictConfig

from gearshift.config import ConfigError
from gearshift.config.rules import is_searchpath
from gearshift.engine.failures import TrainingFailed
from gearshift.state import run_lock
from gearshift.state.preemption import TrainingStopped

EXIT_BAD_CONFIG = 2
EXIT_TRAINING_FAILED = 1  # a NaN/inf loss, out of memory: one line says why and what next
# Set by `python -m gearshift.torchrun`: rank 0 writes its one line there for the launcher
ERROR_NOTE = "GEARSHIFT_ERROR_NOTE"
log = logging.getLogger("gearshift.app")  # run_task's: train.log names the task that ended


def end_run(error: Exception, hydra_cfg: DictConfig, rank: str | None) -> NoReturn:
    """run_task's end of a run that does not train to its end, in one line and its exit code:
    a stop (the shell's code for the signal), a failure (1), unusable input found once the
    run began, a ConfigError or CheckpointError (2, and no run folder left behind)."""
    if isinstance(error, TrainingStopped):
        stop(error, hydra_cfg)
    if isinstance(error, TrainingFailed):
        _note_in_log_file(f"error: {error}")
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(EXIT_TRAINING_FAILED) from None
    if rank in (None, "0"):  # the job's other ranks: rank 0 speaks for it
        remove_empty_run_dir(Path(hydra_cfg.runtime.output_dir))
    refuse(str(error), rank)


def stop(stopped: TrainingStopped, hydra_cfg: DictConfig) -> NoReturn:
    """A stopped run's line (rank 0's), a SLURM job handed back to submitit, the exit code."""
    if os.environ.get("RANK", "0") == "0":  # rank 0 speaks for the job
        line = stop_line(stopped, hydra_cfg)
        _note_in_log_file(line, logging.WARNING)
        print(line, file=sys.stderr)
    if stopped.handover is not None:
        stopped.handover(stopped.signum, None)  # submitit: requeue this SLURM job, then exit
    raise SystemExit(128 + stopped.signum) from None  # the shell's code for "killed by"


def _note_in_log_file(message: str, level: int = logging.ERROR) -> None:
    """`message` in train.log only: the console gets it once, as a plain line."""
    record = log.makeRecord(log.name, level, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def refuse(message: str, rank: str | None) -> NoReturn:
    """One `error:` line and exit 2; in a job of several ranks (`rank`: app.job_rank), rank
    0's line only (under gearshift.torchrun written for the launcher, which prints it once
    the ranks are done)."""
    if rank not in (None, "0"):
        raise SystemExit(EXIT_BAD_CONFIG)
    if rank == "0" and os.environ.get(ERROR_NOTE):
        Path(os.environ[ERROR_NOTE]).write_text(message)  # read after every rank has exited
    else:
        print(f"error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_BAD_CONFIG)


def describe_error(error: Exception, override: str | None, overrides: Sequence[str] = ()) -> str:
    """One line out of Hydra's and OmegaConf's multi-line messages."""
    if isinstance(error, MissingConfigException) and override and "=" in override:
        group, value = override.split("=", 1)
        group = group.lstrip("+~")
        search = [o for o in overrides if is_searchpath(o)]  # your folders' options too
        options = GlobalHydra.instance().config_loader().get_group_options(group, overrides=search)
        if options:
            return f"{group}={value!r} is not allowed; choose one of: {', '.join(options)}"
    from gearshift.config.unknown_keys import describe_unknown_key  # a bad command line only

    cause = error.__cause__ or error
    if unknown := describe_unknown_key(cause, [*overrides, *([override] if override else [])]):
        return unknown
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    first = lines[0] if lines else type(error).__name__
    return f"{override}: {first}" if override else first


def culprit(error: Exception, overrides: list[str]) -> str | None:
    """The override a Hydra error is about, when its message names one."""
    text = str(error)
    overrides = [o for o in overrides if not is_searchpath(o)]  # Hydra names it in every message
    matches = [o for o in overrides if o in text or o.split("=", 1)[0].lstrip("+~") in text]
    return matches[0] if matches else None


def a_value(override: Override) -> Any:
    """One value a search-space override names: its first choice, an interval's low end
    (what preflight checks a search key Hydra refuses at, before it refuses the line)."""
    value = override.value()
    if isinstance(value, IntervalSweep):
        return value.start
    if override.is_sweep_override():
        return next(iter(override.sweep_string_iterator()), "null")
    return override.get_value_element_as_str()


def print_plan(cfg: DictConfig, rank: str | None) -> None:
    """plan=on: the run's memory and step time, printed; exit 0 before Hydra creates a run
    folder (nothing trains, nothing is allocated but fake tensors)."""
    if rank not in (None, "0"):  # rank 0 plans for the job
        raise SystemExit(0)
    from gearshift.observe.plan import log_plan, make_plan  # loads torch: only now

    if not logging.getLogger().handlers:  # before Hydra: its job_logging is not set up yet
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        log_plan(make_plan(cfg))
    except ConfigError as error:
        refuse(str(error), rank)
    raise SystemExit(0)


def stop_line(stopped: TrainingStopped, hydra_cfg: DictConfig) -> str:
    """The one line a stopped run ends with: the signal, the step, the checkpoint, and the
    command that resumes it (resume=auto in the same run folder)."""
    if hydra_cfg.mode == RunMode.MULTIRUN:
        again = f"run the same sweep with hydra.sweep.dir={hydra_cfg.sweep.dir}"
    else:
        again = f"run the same command with hydra.run.dir={hydra_cfg.run.dir}"
    if stopped.checkpoint is None:
        return f"{stopped}; no checkpoint saved"
    return f"{stopped}; checkpoint {stopped.checkpoint}; to resume, {again}"


def remove_empty_run_dir(run_dir: Path) -> None:
    """Drop a run folder that holds nothing but what Hydra wrote before the task began,
    and the folders above it (runs/, multirun/<date>/) that it leaves empty."""
    leftovers = {p.name for p in run_dir.iterdir()} - {".hydra", "train.log", run_lock.LOCK_FILE}
    if leftovers:
        return
    logging.shutdown()  # close train.log before removing it
    shutil.rmtree(run_dir, ignore_errors=True)
    cwd = Path.cwd().resolve()
    for parent in run_dir.resolve().parents:
        if cwd not in parent.parents:
            break
        try:
            parent.rmdir()  # only when empty
        except OSError:
            break
