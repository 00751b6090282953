"""Throughput, step time, data-wait share and peak memory, measured without host syncs
(docs/gears.md, section 5): clock reads on the host for each step and each wait for a batch
and, on CUDA, one recorded event a step, read at log points right after the loop's one sync.
Intervals before `warmup_steps` (start-up, compilation, autotuning) and, under profile=on,
the profiled steps (profiler.py's ProfiledMeter) are kept out of the steady-state figures.
"""

from __future__ import annotations

import logging
import resource
import statistics
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise

import torch

log = logging.getLogger(__name__)


@dataclass
class Interval:
    """What happened between two log points."""

    steps: int = 0
    samples: int = 0
    seconds: float = 0.0  # wall clock
    data_wait_seconds: float = 0.0
    step_ms: list[float] = field(default_factory=list)

    def add(self, other: Interval) -> None:
        self.steps += other.steps
        self.samples += other.samples
        self.seconds += other.seconds
        self.data_wait_seconds += other.data_wait_seconds
        self.step_ms += other.step_ms

    @property
    def samples_per_sec(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def median_step_ms(self) -> float:
        return statistics.median(self.step_ms) if self.step_ms else 0.0

    @property
    def data_wait_pct(self) -> float:
        return 100.0 * self.data_wait_seconds / self.seconds if self.seconds > 0 else 0.0


class PerfMeter:
    def __init__(self, device: torch.device, warmup_steps: int) -> None:
        self.cuda = device.type == "cuda"
        self.warmup_steps = warmup_steps
        self.steps_done = 0
        self.steady = Interval()  # the sum of the intervals after warm-up
        self.everything = Interval()
        self._open(self._mark())

    def _mark(self) -> torch.cuda.Event | float:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _open(self, mark: torch.cuda.Event | float) -> None:
        """Start an interval at `mark` (the last step's end)."""
        self._start_time = time.perf_counter()
        self._segments = [[mark]]  # the step marks, a new segment after each pause
        self._pauses: list[tuple] = []  # (the last step's mark, the mark going on after it)
        self._current = Interval()

    def resume(self) -> None:
        """Go on after a pause (validation, start-up): the time since the last step is left
        out; the interval's steps so far stay in it."""
        mark = self._mark()
        self._pauses.append((self._segments[-1][-1], mark))
        self._segments.append([mark])

    def timed(self, batches: Iterable) -> Iterator:
        """Yield from `batches`, counting how long the host waited for each one."""
        iterator = iter(batches)  # a loader's start (its workers) is no wait for a batch
        start = time.perf_counter()
        for batch in iterator:
            self.add_data_wait(time.perf_counter() - start)
            yield batch
            start = time.perf_counter()

    def add_data_wait(self, seconds: float) -> None:
        self._current.data_wait_seconds += seconds

    def step(self, samples: int) -> None:
        self._segments[-1].append(self._mark())
        self.steps_done += 1
        self._current.samples += samples
        self._current.steps += 1

    def flush(self) -> Interval:
        """Close the interval; call right after a host sync so the events are complete."""
        interval, last = self._current, self._segments[-1][-1]
        wall = time.perf_counter() - self._start_time
        if self.cuda:
            last.synchronize()
        between_ms = torch.cuda.Event.elapsed_time if self.cuda else lambda a, b: 1000 * (b - a)
        paused = sum(between_ms(a, b) for a, b in self._pauses) / 1000
        interval.step_ms = [
            between_ms(a, b) for marks in self._segments for a, b in pairwise(marks)
        ]
        # A pause starts at the last step's mark, which may precede the interval's start
        # (the log step's read, a preempted host): its steps' own time is the floor.
        interval.seconds = max(wall - paused, sum(interval.step_ms) / 1000)
        self.everything.add(interval)
        if self.steps_done - interval.steps >= self.warmup_steps:
            self.steady.add(self._steady_part(interval))
        self._open(last)
        return interval

    def _steady_part(self, interval: Interval) -> Interval:
        """What of a closed interval after warm-up counts as steady state: all of it (a
        profiled run's meter leaves its profiled steps out)."""
        return interval

    def steady_state(self) -> Interval:
        if self.steady.steps:
            return self.steady
        log.warning(
            "the run ended within its %d warm-up steps: throughput includes warm-up",
            self.warmup_steps,
        )
        return self.everything


def peak_memory(device: torch.device) -> tuple[int, str]:
    """(bytes, kind): CUDA's peak allocated memory, or the process's peak resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_allocated"
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return max_rss * (1 if sys.platform == "darwin" else 1024), "cpu_rss"


def memory_metrics(device: torch.device) -> dict[str, float]:
    gib = 2**30
    if device.type == "cuda":
        return {
            "mem/peak_allocated_gib": torch.cuda.max_memory_allocated(device) / gib,
            "mem/peak_reserved_gib": torch.cuda.max_memory_reserved(device) / gib,
        }
    return {"mem/peak_rss_gib": peak_memory(device)[0] / gib}
