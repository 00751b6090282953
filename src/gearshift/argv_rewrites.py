"""preflight's rewrites of the command line, which Hydra parses after it (app.py): true/false
given to a switch group written as on/off, so that Hydra composes and records `amp=on`
(config/switches.py); on a rank other than 0 (torchrun, srun), Hydra's own files pointed away
from the run folder. Loaded when a command line needs one."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from hydra.core.global_hydra import GlobalHydra

from gearshift.config import ConfigError
from gearshift.config.rules import is_searchpath
from gearshift.config.switches import switches_in_words


def reword_switches(command_line: list[str], overrides: list[str], rank: str | None) -> list[str]:
    """The overrides with true/false given to a switch group as on/off (config/switches.py),
    rewritten in `command_line` too: Hydra parses that after preflight. True/false given to
    another group: one `error:` line and exit 2 (`rank`: app.job_rank)."""
    search = [o for o in overrides if is_searchpath(o)]  # your folders' options too
    loader = GlobalHydra.instance().config_loader()
    try:
        worded = switches_in_words(
            overrides, lambda g: loader.get_group_options(g, overrides=search)
        )
    except ConfigError as error:
        from gearshift.run_endings import refuse

        refuse(str(error), rank)
    for given, word in zip(overrides, worded, strict=True):
        if word != given:
            command_line[command_line.index(given)] = word
    return worded


def hydra_output_elsewhere(argv: list[str], rank: str) -> None:
    """A rank other than 0 (`rank`): Hydra's run folder a scratch one, removed at exit, with
    no .hydra/ in it and the log on stdout; rank 0 writes the run folder."""
    scratch = Path(tempfile.gettempdir()) / f"gearshift-rank{rank}-{os.getpid()}"
    argv += [f"hydra.run.dir={scratch}", "hydra.output_subdir=null", "hydra/job_logging=stdout"]
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)  # Hydra's empty folder
