"""`distributed.nproc_per_node=N`: start N ranks on this machine with torch's elastic
launcher (what torchrun uses); each rank sets up logging like Hydra would and trains.

Stop signals (SIGTERM, SIGINT, SIGUSR1, ...) sent to this process, the launcher's parent,
are passed on to the ranks by torch elastic (`LaunchConfig.signals_to_handle`); the ranks
save a checkpoint and stop as under torchrun (state/preemption.py), rank 0 tells the parent
which one, and the parent raises `TrainingStopped` for the task to report in one line and
exit 128+signal (torch elastic itself would end in its SignalException traceback).

Input that the ranks find unusable as they build (bad data, task or checkpoint: a
ConfigError) ends the same way as in one process: rank 0 notes the message for the parent,
every rank exits 2 without a traceback, torch elastic's failure report is dropped, and the
task prints one `error:` line, removes the empty run folder and exits 2. Under torchrun the
ranks do the same (rank 0's line, the others silent, exit 2), but torchrun's agent is a
process of its own: it still logs its ChildFailedError report (ranks' exit codes 2, no
traceback of theirs) and exits 1; `python -m gearshift.torchrun` (torchrun.py) ends in the
one line and exit 2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from gearshift.config import ConfigError
from gearshift.data.host_loader import cpu_count
from gearshift.engine.failures import TrainingFailed
from gearshift.parallel.distributed import ranks_from_environment
from gearshift.state.checkpoint_folders import CheckpointError, latest_checkpoint
from gearshift.state.preemption import TrainingStopped

# Passed on to the ranks: torch elastic's own four, and the two that schedulers use to warn
# of a stop (SLURM's --signal, submitit's USR2). The ranks save on TERM, INT, USR1, USR2.
FORWARDED_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
# A rank's exit code for unusable input (run_endings.EXIT_BAD_CONFIG): rank 0 wrote why in its note.
EXIT_BAD_INPUT = 2
EXIT_TRAINING_FAILED = 1  # run_endings.EXIT_TRAINING_FAILED: rank 0 wrote why in its note


def launch_local(
    fit: Callable[..., Any], cfg: DictConfig, run_dir: Path, run_name: str | None
) -> dict[str, Any]:
    """Start `distributed.nproc_per_node` ranks here with torch's elastic launcher (what
    torchrun uses), each training with `fit` (train.py's), and return rank 0's summary;
    raises TrainingStopped on a stop signal."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # Like torchrun: without a setting of the user's, ranks split the CPUs instead of each
    # starting a thread per core (which oversubscribes them, many times slower).
    nproc = cfg.distributed.nproc_per_node
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, cpu_count() // nproc)))
    with tempfile.TemporaryDirectory(prefix="gearshift-launch-") as scratch:
        stop_note = Path(scratch) / "stopped.json"  # rank 0 writes it when it stops
        error_note = error_note_for(stop_note)  # and this when the input is unusable
        failed_note = failed_note_for(stop_note)  # and this when training failed
        with (
            _temporary_files_in(scratch),  # torch elastic's log folder and error files too
            quiet_shutdown(error_note, failed_note),
        ):
            config = _launch_config(cfg, LaunchConfig)
            try:
                launch = elastic_launch(config, run_rank)
                results = launch(fit, cfg, str(run_dir), run_name, str(stop_note))
            except SignalException as signalled:
                raise stopped_ranks(signalled.sigval, stop_note, run_dir) from None
            except ChildFailedError:
                if error_note.exists():  # the task says it in one line, exit 2
                    raise ConfigError(error_note.read_text()) from None
                if failed_note.exists():  # a NaN/inf loss, out of memory: one line, exit 1
                    raise TrainingFailed(failed_note.read_text()) from None
                raise
    return results[0]


def _launch_config(cfg: DictConfig, launch_config: type) -> Any:
    """torch elastic's LaunchConfig for this machine's ranks (made where its default log
    folder, a torchelastic_* made on creation, is to go)."""
    # A stopped rank first reaches the next log step, where the ranks agree to stop, then
    # saves: give it as long as a collective may wait before the launcher kills it.
    # (Older torch has neither field: it passes on TERM, INT, HUP, QUIT and waits 30 s.)
    stopping = {"signals_to_handle": ",".join(FORWARDED_SIGNALS)}
    stopping["shutdown_timeout"] = cfg.distributed.timeout_s
    known = {field.name for field in dataclasses.fields(launch_config)}
    return launch_config(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=cfg.distributed.nproc_per_node,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=cfg.distributed.max_restarts,
        monitor_interval=0.5,
        **{key: value for key, value in stopping.items() if key in known},
    )


@contextlib.contextmanager
def _temporary_files_in(folder: str) -> Iterator[None]:
    """While inside, this process's temporary files go to `folder`, so they go when it
    does: torch elastic's torchelastic_* log folder and torch spawn's
    pytorch-errorfile-*.pickle per rank (a failed rank's stays), which it would leave in
    the system's temporary folder. The ranks keep theirs (torch's compile cache stays
    where every run finds it)."""
    before = tempfile.tempdir
    tempfile.tempdir = folder
    try:
        yield
    finally:
        tempfile.tempdir = before


def stopped_ranks(signum: int, stop_note: Path, run_dir: Path) -> TrainingStopped:
    """How the ranks stopped on `signum`: rank 0's note (its step and checkpoint), or, when
    no rank got to save (killed first, or not yet training), the newest checkpoint."""
    if stop_note.exists():
        note = json.loads(stop_note.read_text())
        return TrainingStopped(signum, note["step"], Path(note["checkpoint"]))
    return TrainingStopped(signum, None, latest_checkpoint(run_dir / "checkpoints"))


def error_note_for(stop_note: Path) -> Path:
    """Where rank 0 writes the message of a ConfigError (bad data, task or checkpoint)."""
    return stop_note.with_name("error.txt")


def failed_note_for(stop_note: Path) -> Path:
    """Where rank 0 writes why training failed (TrainingFailed: a NaN/inf loss, OOM)."""
    return stop_note.with_name("failed.txt")


def run_rank(
    fit: Callable[..., Any], cfg: DictConfig, run_dir: str, run_name: str | None, stop_note: str
) -> dict[str, Any]:
    """One rank started by `launch_local`: log like Hydra would, then train. Stopped by a
    signal, rank 0 writes its step and checkpoint to `stop_note` for the parent, which
    reports it; every rank exits 128+signal. Unusable input (ConfigError, CheckpointError):
    rank 0 writes the message next to it, for the parent's one line; every rank exits 2
    without a traceback. Training that fails (TrainingFailed) alike, with exit 1."""
    ranks = ranks_from_environment()
    handlers: list[logging.Handler] = []
    if ranks.is_zero:
        from rich.logging import RichHandler

        file = logging.FileHandler(Path(run_dir) / "train.log")
        file.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
        handlers = [RichHandler(show_path=False), file]
    level = logging.INFO if ranks.is_zero else logging.WARNING
    logging.basicConfig(level=level, format="%(message)s", handlers=handlers or None, force=True)
    try:
        return fit(cfg, Path(run_dir), run_name).summary
    except TrainingStopped as stopped:
        if ranks.is_zero and stopped.checkpoint is not None:
            note = {"step": stopped.step, "checkpoint": str(stopped.checkpoint)}
            _write_whole(Path(stop_note), json.dumps(note))
        raise SystemExit(128 + stopped.signum) from None
    except (ConfigError, CheckpointError) as error:
        if ranks.is_zero:
            _write_whole(error_note_for(Path(stop_note)), str(error))
        logging.shutdown()  # train.log closed: the parent removes the empty run folder
        raise SystemExit(EXIT_BAD_INPUT) from None
    except TrainingFailed as failed:
        if ranks.is_zero:
            _write_whole(failed_note_for(Path(stop_note)), str(failed))
        raise SystemExit(EXIT_TRAINING_FAILED) from None


def _write_whole(path: Path, text: str) -> None:
    """Write `text` to `path` whole or not at all: the parent reads it once the ranks exit."""
    partial = path.with_suffix(".partial")
    partial.write_text(text)
    partial.replace(path)  # whole or absent


class _ShutdownNotice(logging.Filter):
    """Drops torch elastic's warnings that it got a signal and is closing the ranks, and
    once rank 0 has noted unusable input or a failed run, its reports of the ranks' failure:
    the task says it in its own line."""

    def __init__(self, *notes: Path) -> None:
        super().__init__()
        self.notes = notes

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING and any(note.exists() for note in self.notes):
            return False
        message = str(record.msg)
        return not (
            record.levelno == logging.WARNING
            and any(words in message for words in ("death signal", "via signal", "closing signal"))
        )


# torch elastic's agent and its process context, which log the shutdown and the failure
_ELASTIC_LOGGERS = (
    "torch.distributed.elastic.agent.server.api",
    "torch.distributed.elastic.multiprocessing.api",
    "torch.distributed.elastic.multiprocessing.errors",
    "torch.distributed.elastic.multiprocessing.errors.error_handler",
    "torch.distributed.launcher.api",
    "torch.multiprocessing.spawn",  # "Terminating process ... via signal SIGTERM"
)


@contextlib.contextmanager
def quiet_shutdown(*notes: Path) -> Iterator[None]:
    """While inside: `_ShutdownNotice` on torch elastic's loggers (`notes`: rank 0's)."""
    notice = _ShutdownNotice(*notes)
    for name in _ELASTIC_LOGGERS:
        logging.getLogger(name).addFilter(notice)
    try:
        yield
    finally:
        for name in _ELASTIC_LOGGERS:
            logging.getLogger(name).removeFilter(notice)
