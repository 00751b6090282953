"""Tip 1 of docs/gears.md: copy a dataset folder to fast local disk once per node, before training.

Every process of a node may call `stage` at the same moment. One of them takes an
exclusive lock on `<stage_to>/<name>.lock` and copies into a temporary folder, then
renames it into place; the rename is atomic, so a folder with the final name is always
complete. The others block on the lock and then reuse that copy. A copy cut short
(a killed process) leaves only a temporary folder, which the next lock holder deletes;
the kernel drops a dead process's lock by itself.

Only the standard library here: staging runs before torch is needed.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

_TMP_INFIX = ".tmp-"


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if missing) for the `with` block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # blocks while another process holds it
        yield
    finally:
        os.close(fd)  # closing releases the lock


def staged_path(source: Path, stage_to: Path, key: str = "") -> Path:
    """Where `source` is copied: its name plus a hash of its absolute path (no clashes) and
    of `key` (what else the copy depends on: resized.py's format, size and file list)."""
    source = source.resolve()
    digest = hashlib.sha1((str(source) + key).encode()).hexdigest()[:8]
    return stage_to / f"{source.name}-{digest}"


def stage(
    source: Path,
    stage_to: Path,
    copy: Callable[[Path, Path], object] = shutil.copytree,
    key: str = "",
) -> Path:
    """The path of a complete copy of the folder `source` under `stage_to`; copy if none yet.

    `copy(src, dst)` must create `dst`; tests pass a slow one to make processes overlap.
    """
    source, stage_to = Path(source), Path(stage_to).expanduser()
    target = staged_path(source, stage_to, key)
    if target.is_dir():  # only a finished copy ever has this name
        log.info("data: reusing the staged copy %s", target)
        return target
    with file_lock(stage_to / f"{target.name}.lock"):
        if target.is_dir():  # another process finished it while this one waited
            log.info("data: reusing the staged copy %s", target)
            return target
        for stale in stage_to.glob(f"{target.name}{_TMP_INFIX}*"):  # left by a killed copy
            shutil.rmtree(stale, ignore_errors=True)
        temporary = stage_to / f"{target.name}{_TMP_INFIX}{os.getpid()}"
        start = time.perf_counter()
        try:
            copy(source, temporary)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        os.rename(temporary, target)  # atomic: the final name appears complete or not at all
        log.info("data: staged %s to %s in %.1f s", source, target, time.perf_counter() - start)
    return target


def stage_path(path: str | None, stage_to: str) -> str:
    """The staged copy of the folder `path` (`data.path` of a source that takes no stage_to)."""
    if not path:
        from gearshift.config import ConfigError

        raise ConfigError(
            f"data.stage_to={stage_to!r} is not allowed; the source takes no stage_to "
            "and has no data.path folder to stage"
        )
    return str(stage(Path(path).expanduser(), Path(stage_to)))
