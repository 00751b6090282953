"""How run_task and preflight end a run that does not train to its end, beside its one
line: a refused command line's `error:` line and exit 2 (Hydra's and OmegaConf's errors in
one line), plan=on's plan and exit 0, a stopped run's line naming the command that resumes
it, and a run refused before its first step leaving no run folder behind. Loaded only then.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.types import IntervalSweep, Override
from hydra.errors import MissingConfigException
from hydra.types import RunMode
from omegaconf import DictConfig

from gearshift.config import ConfigError
from gearshift.config.rules import is_searchpath
from gearshift.state import run_lock
from gearshift.state.preemption import TrainingStopped

EXIT_BAD_CONFIG = 2
# Set by `python -m gearshift.torchrun`: rank 0 writes its one line there for the launcher
ERROR_NOTE = "GEARSHIFT_ERROR_NOTE"


def refuse(message: str, rank: str | None) -> None:
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
