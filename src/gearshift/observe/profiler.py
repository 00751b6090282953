"""`profile=on`: torch.profiler over a window of steps after the run's warm-up.

The window starts `profile.wait` optimizer steps after the `warmup_steps` the throughput
figures leave out anyway; the profiler then warms up for `profile.warmup` steps (recorded
and discarded: its own start-up) and records `profile.active` steps. It writes, into the
run folder:

- `profile/trace.json.gz`: the Chrome trace of the active steps (CPU ops, and on CUDA the
  kernels), for https://ui.perfetto.dev or chrome://tracing;
- `profile/ops.txt`: the operators by self time (device time on CUDA, else CPU time).

The profiled steps (its warm-up and active ones) run slower, so the run's meter
(ProfiledMeter) leaves them out of every throughput figure (`window`). Under DDP only
rank 0 records; every rank leaves the same steps out.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from gearshift.config.schema import ProfileConfig
from gearshift.observe.logger_backend import NullLogger
from gearshift.observe.throughput import Interval, PerfMeter

log = logging.getLogger(__name__)

TRACE, OPS = "profile/trace.json.gz", "profile/ops.txt"
LOGGED_ROWS = 10  # of ops.txt, in the log at the end of the run


class ProfiledMeter(PerfMeter):
    """The meter of a run that profiles: the profiled steps (`window`, numbered from 1 as
    `step` counts them) are kept out of the steady-state figures, their time, samples and
    data wait. The interval `flush` returns, which the log step reports, still holds them."""

    def __init__(self, device: torch.device, warmup_steps: int, window: range) -> None:
        self.window = window
        super().__init__(device, warmup_steps)

    def _open(self, mark: torch.cuda.Event | float) -> None:
        super()._open(mark)
        self._left = Interval()  # the interval's left-out steps (their step_ms: at flush)
        self._left_indices: list[int] = []
        self._step_wait = 0.0

    def add_data_wait(self, seconds: float) -> None:
        super().add_data_wait(seconds)
        self._step_wait += seconds

    def step(self, samples: int) -> None:
        super().step(samples)
        if self.steps_done in self.window:
            self._left_indices.append(self._current.steps - 1)
            self._left.steps += 1
            self._left.samples += samples
            self._left.data_wait_seconds += self._step_wait
        self._step_wait = 0.0

    def _steady_part(self, interval: Interval) -> Interval:
        if not self._left_indices:
            return interval
        left = set(self._left_indices)
        left_ms = [ms for i, ms in enumerate(interval.step_ms) if i in left]
        return Interval(
            steps=interval.steps - self._left.steps,
            samples=interval.samples - self._left.samples,
            seconds=max(0.0, interval.seconds - sum(left_ms) / 1000),
            data_wait_seconds=max(0.0, interval.data_wait_seconds - self._left.data_wait_seconds),
            step_ms=[ms for i, ms in enumerate(interval.step_ms) if i not in left],
        )


@dataclass(frozen=True)
class OpRow:
    name: str
    calls: int
    self_ms: float  # device time on CUDA, else CPU time
    total_ms: float
    self_share: float  # of all operators' self time


class Profiler:
    def __init__(
        self,
        cfg: ProfileConfig,
        device: torch.device,
        run_dir: Path,
        warmup_steps: int,
        recording_rank: bool,
    ) -> None:
        self.cfg, self.device, self.run_dir = cfg, device, run_dir
        start = warmup_steps + cfg.wait  # steps of this process before the profiler starts
        # The steps the profiler slows down, numbered as PerfMeter.step counts them (from 1).
        self.window = (
            range(start + 1, start + cfg.warmup + cfg.active + 1) if cfg.enabled else range(0)
        )
        self.active = range(start + cfg.warmup + 1, self.window.stop)
        self.start = start
        self.records = cfg.enabled and recording_rank
        self.steps_done = 0
        self.first_step: int | None = None  # the run's number of the first active step
        self.last_step: int | None = None
        self.torch_profiler: profile | None = None
        self.rows: list[OpRow] = []
        self.summary: dict[str, Any] | None = None
        self.finished = False

    def begin(self) -> None:
        """Before the first step (a window right at the start opens here)."""
        if self.records and self.steps_done == self.start:
            self._start()

    def after_step(self, step: int) -> None:
        """After each optimizer step; `step` is the run's step number (resumed runs go on)."""
        if not self.records:
            return
        self.steps_done += 1
        if self.steps_done in self.active:
            self.first_step = self.first_step or step
            self.last_step = step
        if self.steps_done == self.start:
            self._start()
        elif self.steps_done == self.window.stop - 1:
            self.finish()
        elif self.torch_profiler is not None:
            self.torch_profiler.step()

    def _start(self) -> None:
        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self.torch_profiler = profile(
            activities=activities,
            schedule=schedule(wait=0, warmup=self.cfg.warmup, active=self.cfg.active, repeat=1),
            record_shapes=self.cfg.record_shapes,
            with_stack=self.cfg.with_stack,
            profile_memory=self.cfg.profile_memory,
        )
        self.torch_profiler.start()

    def finish(self) -> dict[str, Any] | None:
        """Stop (a run that ended inside the window keeps the active steps it made), write
        the trace and ops.txt, log the top operators; summary.json's `profile` entry."""
        if self.finished or not self.records:
            return self.summary
        self.finished = True
        if self.torch_profiler is None:
            log.warning(
                "profile: the run ended before the profiled steps (%d to %d of this process); "
                "nothing recorded",
                self.active.start,
                self.active.stop - 1,
            )
            return None
        prof, self.torch_profiler = self.torch_profiler, None
        prof.stop()
        if self.first_step is None:
            log.warning("profile: the run ended in the profiler's warm-up; nothing recorded")
            return None
        (self.run_dir / TRACE).parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.run_dir / TRACE))
        self.rows = op_rows(prof, self.device.type == "cuda")
        (self.run_dir / OPS).write_text(self.table(len(self.rows)))
        log.info(
            "profile of steps %d-%d: %s", self.first_step, self.last_step, self.run_dir / TRACE
        )
        self.summary = {"trace": TRACE, "ops": OPS, "steps": [self.first_step, self.last_step]}
        return self.summary

    @property
    def columns(self) -> list[str]:
        where = "CUDA" if self.device.type == "cuda" else "CPU"
        return ["operator", "calls", f"self {where} ms", "total ms", "self %"]

    def table(self, limit: int) -> str:
        """The operators by self time, a plain-text table (ops.txt holds all of them)."""
        name, calls, self_ms, total_ms, share = self.columns
        lines = [f"{name:<40} {calls:>6} {self_ms:>13} {total_ms:>10} {share:>7}"]
        for row in self.rows[:limit]:
            lines.append(
                f"{row.name[:40]:<40} {row.calls:>6} {row.self_ms:>13.3f} "
                f"{row.total_ms:>10.3f} {100 * row.self_share:>6.1f}%"
            )
        return "\n".join(lines) + "\n"

    def report(self, logger: NullLogger, step: int) -> None:
        """At the end of the run: the top operators to the log, the table to the logger
        (W&B: `profile/ops`), the trace as a file (W&B: an artifact, online only)."""
        if self.summary is None:
            return
        log.info(
            "profile of steps %d-%d, top operators by self time (all: %s):\n%s",
            self.first_step,
            self.last_step,
            self.run_dir / OPS,
            self.table(LOGGED_ROWS),
        )
        rows = [[r.name, r.calls, r.self_ms, r.total_ms, 100 * r.self_share] for r in self.rows]
        logger.log_table("profile/ops", self.columns, rows, step)
        logger.log_file(self.run_dir / TRACE, "profile-trace", "profile")


def op_rows(prof: profile, cuda: bool) -> list[OpRow]:
    """The operators by self time over the active steps, heaviest first. The profiler's own
    step markers (ProfilerStep#N, averaged as ProfilerStep*) are left out: their self time
    is the loop's Python."""
    events = [e for e in prof.key_averages() if not e.key.startswith("ProfilerStep")]

    def self_us(e) -> float:
        return e.self_device_time_total if cuda else e.self_cpu_time_total

    def total_us(e) -> float:
        return e.device_time_total if cuda else e.cpu_time_total

    everything = sum(self_us(e) for e in events) or 1.0
    events.sort(key=self_us, reverse=True)
    return [
        OpRow(e.key, e.count, self_us(e) / 1000, total_us(e) / 1000, self_us(e) / everything)
        for e in events
        if self_us(e) > 0
    ]
