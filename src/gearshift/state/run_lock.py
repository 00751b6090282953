"""A run folder has one writer: the kernel's exclusive lock (`flock`) on `<run dir>/.lock`
for the run's life, so it goes with its process however that ends (docs/checkpoints.md).
The file holds the holder's pid, for the line a second process ends with. The ranks of one
job share their job's lock: the local launcher or rank 0 holds it. On NFS, Linux maps flock
to the server's byte-range locks, which hold across nodes.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = ".lock"
_held: dict[Path, int] = {}  # run folder -> the open file whose lock this process holds


class RunFolderBusy(Exception):
    """Another live process writes in this run folder; the message names it."""

    def __init__(self, run_dir: Path, pid: int | None) -> None:
        who = f"process {pid}" if pid else "another process"
        super().__init__(
            f"run folder {run_dir} is in use by {who}, which is still running; wait for it "
            f"to end, or stop it (kill {pid or '<pid>'}) and run again to resume from its checkpoint"
        )


def hold(run_dir: Path) -> None:
    """Take `run_dir`'s lock for the rest of this process's life; RunFolderBusy when
    another process holds it. Taking it again in the same process is a no-op."""
    run_dir = run_dir.resolve()
    if run_dir in _held:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited (PEP 446)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _pid_in(fd)
        os.close(fd)
        raise RunFolderBusy(run_dir, pid) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _held[run_dir] = fd


def release(run_dir: Path) -> None:
    """Give the lock back before the process ends (a sweep's run in the sweep's process)."""
    fd = _held.pop(run_dir.resolve(), None)
    if fd is not None:
        os.close(fd)  # closing the file drops its lock


def holder(run_dir: Path, wait: bool = False) -> int | None:
    """The pid of the live process that holds `run_dir`'s lock (0 when it wrote none);
    None when no process does. `wait`: block until none does (the holder ended, however),
    then None. Writes nothing."""
    try:
        fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if wait else fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _pid_in(fd) or 0
    finally:
        os.close(fd)  # a shared lock taken to test is dropped with the file
    return None


def _pid_in(fd: int) -> int | None:
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return int(text) if text.isdigit() else None
