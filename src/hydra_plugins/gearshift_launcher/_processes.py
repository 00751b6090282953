"""The machinery of `hydra/launcher=processes` (processes.py, the plugin, hands its jobs to
`ProcessLauncher`): each job of a sweep in a fresh Python process, one at a time.

Hydra's basic launcher runs every job inside the sweep's own process, so what one run
leaves behind (the process's peak resident memory, allocator caches, compiled kernels)
shows up in the figures of the runs after it. submitit's local launcher starts a fresh
process per job, but all of them at once, so they compete for the machine. A sweep
that measures (the gear ablation) wants both: every run alone, in its own process.
The Optuna sweeper launches up to `n_jobs` trials at once, each from its own thread; it
first calls `use_slots(n_jobs)`, and each trial then runs in a device slot of its own
(slots.py: one GPU, or a disjoint set of cores, per trial).
A job whose sweep is gone (killed by SIGKILL) stops at its next step and saves. A job's end
is noticed the moment its process exits (its Popen is waited on), and one that ended without
a result fails with one line: its last `error:` line, or its exit status.
Job logs go to `<sweep folder>/.submitit/`, each file named by its job's id.
"""

import copy
import logging
import os
import queue
import select
import shlex
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher import config, submitit_launcher
from omegaconf import OmegaConf

from hydra_plugins.gearshift_launcher._slots import (
    Slot,
    enter_slot,
    plan_slots,
    slot_setup,
    usable_cores,
    visible_gpus,
)

log = logging.getLogger(__name__)


def keep_visible_gpus() -> list[str]:
    """Shell lines that give the job the GPUs this process sees (submitit's local executor
    sets CUDA_VISIBLE_DEVICES from gpus_per_node, which would hide or renumber them)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return ["unset CUDA_VISIBLE_DEVICES"]
    return [f"export CUDA_VISIBLE_DEVICES={shlex.quote(listed)}"]


class ProcessLauncher(submitit_launcher.LocalLauncher):
    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.own_setup = list(self.params.get("setup") or [])
        self.params["setup"] = keep_visible_gpus() + self.own_setup
        self.sweep_pid = os.getpid()  # a job stops when this process (the sweep) is gone
        self.slot: Slot | None = None  # in a job: the slot it runs in
        self.free_slots: queue.Queue[Slot] | None = None  # in the sweep: slots not in use

    def use_slots(self, n: int) -> None:
        """From now on, each `launch` call (up to `n` at once, from the sweeper's threads)
        runs its jobs in a slot of their own (slots.py); SlotError when the machine has too
        few GPUs or cores for `n`. One at a time (`n=1`) uses the whole machine, as without."""
        slots = plan_slots(n, usable_cores(), visible_gpus())
        if n == 1:
            return
        self.free_slots = queue.Queue()
        for slot in slots:
            self.free_slots.put(slot)

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> list[JobReturn]:
        if self.free_slots is None:
            return self.launch_in(self, job_overrides, initial_job_idx)
        slot = self.free_slots.get()  # one is free: the sweeper launches at most n at once
        try:
            return self.launch_in(self.in_slot(slot), job_overrides, initial_job_idx)
        finally:
            self.free_slots.put(slot)

    def in_slot(self, slot: Slot) -> "ProcessLauncher":
        """This launcher for jobs in `slot`: its shell lines set the slot's devices, and the
        job (this object, pickled) enters the slot before it runs."""
        launcher = copy.copy(self)
        gpus = keep_visible_gpus() if slot.gpus is None else []
        launcher.params = {**self.params, "setup": gpus + slot_setup(slot) + self.own_setup}
        launcher.slot, launcher.free_slots = slot, None
        return launcher

    def __call__(self, *args: Any, **kwargs: Any) -> JobReturn:
        # in the job's process, before the task runs
        stop_when_gone(self.sweep_pid)
        if self.slot is not None:
            enter_slot(self.slot)
        return super().__call__(*args, **kwargs)

    @staticmethod
    def launch_in(
        launcher: "ProcessLauncher",
        job_overrides: Sequence[Sequence[str]],
        initial_job_idx: int,
    ) -> list[JobReturn]:
        results = []
        for offset, overrides in enumerate(job_overrides):
            number = initial_job_idx + offset
            result = job_result(launcher.start_job(overrides, number))  # JobFailed: no result
            failed = result.status == JobStatus.FAILED
            log.info("\t#%d %s", number, "failed" if failed else "done")
            results.append(result)
        return results

    def start_job(self, overrides: Sequence[str], number: int) -> Any:
        """Job `number` in a process of its own, as submitit's local launcher starts it
        (the same executor and parameters); returns the submitit job at once."""
        import submitit

        assert self.config is not None
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in self.config.hydra.sweep:
            os.chmod(sweep_dir, mode=int(str(self.config.hydra.sweep.mode), 8))
        # The folder up to its part that names the job (`%j`): the jobs' files side by side,
        # named by job id. submitit's local controller opens its log in `<folder>/<its pid>/`
        # at once, and this process makes that folder only after the controller started,
        # which a busy machine can lose (the job failed with FileNotFoundError and no run);
        # this folder is made before any job starts.
        from submitit.core.utils import JobPaths

        folder = JobPaths.get_first_id_independent_folder(self.params["submitit_folder"])
        executor = submitit.AutoExecutor(cluster=self._EXECUTOR, folder=folder)
        common = set(OmegaConf.structured(config.BaseQueueConf).keys())
        executor.update_parameters(
            **{
                key if key in common else f"{self._EXECUTOR}_{key}": value
                for key, value in self.params.items()
                if key != "submitit_folder"
            }
        )
        log.info("\t#%d : %s", number, " ".join(filter_overrides(overrides)))
        state = Singleton.get_state()
        return executor.submit(
            self, list(overrides), "hydra.sweep.dir", number, f"job_id_for_{number}", state
        )


class JobFailed(RuntimeError):
    """A job's process ended without a result; the message is one line saying why."""

    one_line = True  # the sweeper records the message as the trial's failure, as it is


def job_result(job: Any) -> JobReturn:
    """The job's JobReturn the moment its process ends. (submitit's `results()` looks every
    second, and gives a process that exited without a result 15 s more to write one: a
    trial that failed was noticed that late.) JobFailed when it ended without one: its last
    `error:` line, else its exit status."""
    code = job._process.wait()  # the Popen of submitit's local job: no polling
    if job.paths.result_pickle.exists():  # written before the process exits
        return job.results()[0]  # done: returns at once, or raises the job's exception
    raise JobFailed(failure_line(job.stderr() or job.stdout() or "", code))


def failure_line(printed: str, code: int) -> str:
    """Why a process ended without a result, in one line: the last line it printed that
    starts with `error:` (without that word), else its exit status or signal."""
    said = [
        line[len("error:") :].strip() for line in printed.splitlines() if line.startswith("error:")
    ]
    if said:
        return said[-1]
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exited with status {code} (no error: line on its stderr)"


def stop_when_gone(pid: int) -> None:
    """Send this process SIGTERM once process `pid` (its sweep) has ended: a trial whose
    sweep was killed (SIGKILL, a lost terminal) stops at its next step and saves, as on any
    stop signal, instead of training on with no one waiting for it; one still building its
    run exits (submitit's handler would let SIGTERM pass). A rerun of the sweep resumes it."""
    signal.signal(signal.SIGTERM, _exit_on_signal)  # the loop's own takes over while it trains

    def watch() -> None:
        try:
            sweep = os.pidfd_open(pid)
        except ProcessLookupError:
            pass  # it has ended already
        else:
            select.select([sweep], [], [])  # a process's pidfd is readable once it ends
            os.close(sweep)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="sweep-watch", daemon=True).start()


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
