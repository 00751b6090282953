"""Test helpers: compose the real config (conf/) with overrides, as Hydra would."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import math
import os
import runpy
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.multiprocessing as mp
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

import gearshift.config  # noqa: F401  (registers the schema with the ConfigStore)
import train
from gearshift.data.decode import UnreadableImage
from gearshift.data.host_loader import EpochSampler
from gearshift.engine import cpu_probe
from gearshift.state.checkpoint_folders import latest_checkpoint
from gearshift.tasks import Task, build_task
from train import fit

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"

# Every time limit in the tests is what a quiet 2-core machine needs, with room to spare,
# times this factor: a slower or busier machine (a CI runner) sets it to 2 or 3.
TIME_FACTOR = float(os.environ.get("GEARSHIFT_TEST_TIME_FACTOR", "1"))
assert TIME_FACTOR > 0, f"GEARSHIFT_TEST_TIME_FACTOR={TIME_FACTOR} must be > 0"


def load_script(name: str):
    """scripts/`name`.py as the module `name` (scripts/ is not a package), for tests of its
    functions: in sys.modules, where its dataclasses look themselves up, and with scripts/ on
    sys.path (last, shadowing nothing installed), where it finds its siblings as when run."""
    if str(ROOT / "scripts") not in sys.path:
        sys.path.append(str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def seconds(limit: float) -> float:
    """A time limit of the tests, scaled by GEARSHIFT_TEST_TIME_FACTOR."""
    return limit * TIME_FACTOR


# Small, fast and quiet; a test adds what it needs.
TINY = (
    "logger=none",
    "progress_bar=false",
    "data.num_samples=256",
    "data.num_val_samples=64",
    "data.image_size=16",
    "batch_size=16",
)


def make_cfg(*overrides: str, tiny: bool = True) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=[*(TINY if tiny else ()), *overrides])


def stops_at_damaged_file(cfg: DictConfig, folder: Path, damaged: Path) -> Path:
    """fit() over images one of which cannot be decoded: the run ends with one line that
    names the file and the checkpoint saved first, which this returns."""
    with pytest.raises(UnreadableImage) as error:
        fit(cfg, folder)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"cannot decode image {damaged}: ")
    checkpoint = latest_checkpoint(folder / "checkpoints")
    assert checkpoint is not None and f"saved {checkpoint}" in message
    return checkpoint


class Logged(list):
    """What train.py's loop logged, as it logged it: the metrics of each call, in order,
    with the step of each in `steps`."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[int] = []


def record_logs(patch) -> Logged:
    """Record what the loop logs on this process's rank (other ranks log to a null logger;
    theirs is recorded too). `patch`: pytest's monkeypatch, or a MonkeyPatch context."""
    logged, build = Logged(), train.build_logger

    def recording(*args, **kwargs):
        logger = build(*args, **kwargs)
        log = logger.log

        def record(metrics: dict, step: int) -> None:
            logged.append(dict(metrics))
            logged.steps.append(step)
            log(metrics, step)

        logger.log = record
        return logger

    patch.setattr(train, "build_logger", recording)
    return logged


def task_of(cfg: DictConfig) -> Task:
    return build_task(cfg.task)


def run_train(
    *args: str, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python train.py ARGS` in `cwd` (where its runs/ folder goes); `timeout` gets scaled;
    `env`: variables set on top of this process's."""
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=seconds(timeout),
        env={**os.environ, **env} if env else None,
    )


@contextmanager
def _working_in(folder: Path) -> Iterator[None]:  # contextlib.chdir, from Python 3.11 on
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(worker, nprocs: int, *args, spawn: bool = False) -> None:
    """`worker(rank, *args)` in `nprocs` processes, and wait for them. Forked, so each rank
    starts with torch imported (a spawned one spends seconds importing it again); spawned
    where this process has started CUDA, which a forked child cannot use."""
    method = "spawn" if spawn or torch.cuda.is_initialized() else "fork"
    mp.start_processes(worker, args=args, nprocs=nprocs, start_method=method)


# A backward this process ran on a device (the planner's fake CUDA tensors, in a test that
# ran in this pytest worker before) started autograd's device threads: a forked child's
# backward then fails at once with this, and the ranks are spawned instead.
FORKED_AUTOGRAD = "Unable to handle autograd's threading in combination with fork"


def on_ranks(worker, ranks: int, out: Path, overrides: list[str]) -> list[dict]:
    """`worker(rank, ranks, port, out, overrides)` (tests/distributed_workers.py) on `ranks`
    ranks; what they saved as out/rank<r>.pt, in rank order."""
    try:
        start_ranks(worker, ranks, ranks, free_port(), str(out), overrides)
    except mp.ProcessRaisedException as error:
        if FORKED_AUTOGRAD not in str(error):
            raise
        shutil.rmtree(out, ignore_errors=True)  # what the failed ranks began
        Path(out).mkdir(parents=True)
        start_ranks(worker, ranks, ranks, free_port(), str(out), overrides, spawn=True)
    return [torch.load(p, weights_only=False) for p in sorted(out.glob("rank*.pt"))]


def train_in_process(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python train.py ARGS` run inside this process, as train.py runs it (its preflight,
    then Hydra's main): for input the entry point refuses, in a fraction of a second where a
    process spends seconds importing torch. Each entry point keeps one test of its own that
    runs it as a process (`run_train`), for the exit status and stderr of the real thing."""
    argv = [str(ROOT / "train.py"), *args]
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    stdout, stderr = io.StringIO(), io.StringIO()
    returncode = 0
    with (
        mock.patch.object(sys, "argv", argv),
        mock.patch.dict(os.environ, env or {}),
        # Hydra's logging config replaces the root's handlers and closes them: pytest's own
        # would then fail at every later record. Closed, no; put back below.
        mock.patch.object(logging, "shutdown"),
        _working_in(cwd),
        contextlib.redirect_stdout(stdout),
        contextlib.redirect_stderr(stderr),
    ):
        try:
            runpy.run_path(argv[0], run_name="__main__")
        except SystemExit as stop:
            returncode = stop.code if isinstance(stop.code, int) else 1
        finally:
            GlobalHydra.instance().clear()  # Hydra leaves itself set up after a failed run
            for handler in root.handlers[:]:  # and its logging writing into the run folder
                if handler not in handlers:
                    root.removeHandler(handler)
                    handler.close()
            for handler in handlers:
                root.addHandler(handler)  # a no-op for those still there
            root.setLevel(level)
    return subprocess.CompletedProcess(argv, returncode, stdout.getvalue(), stderr.getvalue())


def fake_cpu_speed(monkeypatch, speed: float) -> None:
    """The CPU probe reports bf16 and fp16 at `speed` x float32 (0.01: emulated, as on an
    AVX2-only CPU; 1.4: native), so a test is about the resolution, not this machine."""

    def measured(dtype: torch.dtype) -> cpu_probe.CpuSpeed:
        return cpu_probe.CpuSpeed(dtype, matmul=speed, conv=speed)

    monkeypatch.setattr(cpu_probe, "cpu_speed", measured)  # precision's and the advisor's


# What amp=on resolved to -> how its reason begins: measured on a CPU (bf16 always, fp16 where
# the CPU reports native kernels), decided by the device's support on CUDA.
AMP_ON_REASONS = {
    "bfloat16": ("bf16: measured", "bf16: this GPU supports it"),
    "float16": ("fp16: measured", "fp16 with a GradScaler: this GPU has no bf16"),
    "off": ("float32: bf16 measured",),
}


def check_amp_on_resolved(gears: dict) -> None:
    """summary.json's gears of an amp=on run whose probe was not faked (a subprocess): what
    the CPU probe picks is a timing, which a busy machine changes, so no dtype is asserted,
    only that the probe decided and the dtype, its reason and the GradScaler agree.
    tests/test_gears.py fakes the probe for each outcome."""
    assert gears["amp_reason"].startswith(AMP_ON_REASONS[gears["amp"]]), gears
    assert gears["grad_scaler"] == (gears["amp"] == "float16"), gears


def only_summary(cwd: Path) -> dict:
    """The summary.json of the one run folder under cwd/runs (asserting there is just one)."""
    found = list((cwd / "runs").glob("*/summary.json"))
    assert len(found) == 1, found
    assert len(list((cwd / "runs").iterdir())) == 1  # one run folder, for all ranks too
    return json.loads(found[0].read_text())


SUMMARY_KEYS = {
    "samples_per_sec",
    "samples_per_sec_per_device",
    "step_time_ms",
    "data_wait_pct",
    "peak_memory_bytes",
    "peak_memory_kind",
    "final_loss",
    "steps",
    "samples",
    "world_size",
    "device",
    "gears",
    "plan",
    "val_loss",
    "val_accuracy",
    "flops_per_sample",
    "achieved_flops_per_sec",
    "peak_flops_per_sec",
    "peak_flops_source",
    "mfu",
    "batch_size_finder",
    "advice",
    "stop_reason",
    "best",
    "ema",
    "profile",
    "nonfinite_skipped_steps",
}


def check_summary(summary: dict, steps: int, samples: int) -> None:
    assert summary.keys() >= SUMMARY_KEYS, SUMMARY_KEYS - summary.keys()
    assert summary["samples_per_sec"] > 0
    assert summary["samples_per_sec_per_device"] == summary["samples_per_sec"]  # one device
    assert summary["step_time_ms"] > 0
    assert 0 <= summary["data_wait_pct"] <= 100
    assert summary["peak_memory_bytes"] > 50 * 2**20  # torch alone is more than that
    assert summary["peak_memory_kind"] == (
        "cuda_allocated" if "cuda" in summary["device"] else "cpu_rss"
    )
    assert math.isfinite(summary["final_loss"])
    assert summary["steps"] == steps and summary["samples"] == samples
    assert summary["world_size"] == 1
    assert 0 <= summary["val_accuracy"] <= 1 and summary["val_loss"] > 0


class ForwardRecorder:
    """Records what every module of `kinds` sees and produces, through torch's global hook."""

    def __init__(self, *kinds: type[nn.Module]) -> None:
        self.kinds, self.calls = kinds, []

    def __enter__(self):
        def hook(module, inputs, output):
            if isinstance(module, self.kinds):
                inference = torch.is_inference_mode_enabled()
                self.calls.append((module, inputs[0], output, inference, module.training))

        self.handle = nn.modules.module.register_module_forward_hook(hook)
        return self

    def __exit__(self, *exc):
        self.handle.remove()

    def training(self):
        return [c[:4] for c in self.calls if c[4]]

    def evaluation(self):
        return [c[:4] for c in self.calls if not c[4]]


class StepCounter:
    def __enter__(self):
        self.count = 0

        def hook(optimizer, args, kwargs):
            self.count += 1

        self.handle = register_optimizer_step_post_hook(hook)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


class SyncCounter:
    """Counts host reads of tensor values: each one of a CUDA tensor waits for the device.

    On CPU every read counts (the loop must not read more there either); with
    `cuda_only=True` reads of host tensors (a sampler's index list) are left out.
    """

    READS = ("item", "tolist", "__bool__", "__float__", "__int__")

    def __init__(self, monkeypatch, cuda_only: bool = False):
        self.count = 0
        for name in self.READS:
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, _original=original, **kwargs):
                if tensor.is_cuda or not cuda_only:
                    self.count += 1
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)


@contextmanager
def recording_epoch_samples() -> Iterator[list[int]]:
    """The ids of epoch 0's training samples, in the order every EpochSampler of this process
    hands them out (to its DataLoader) while the block runs."""
    taken: list[int] = []
    iterate = EpochSampler.__iter__

    def recording(sampler):
        for index in iterate(sampler):
            if sampler.epoch == 0 and sampler.shuffle:
                taken.append(index)
            yield index

    EpochSampler.__iter__ = recording
    try:
        yield taken
    finally:
        EpochSampler.__iter__ = iterate


HOLD = """
import sys, time
from pathlib import Path
from gearshift.state import run_lock
run_lock.hold(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(600)
"""


def holding_process(run_dir) -> subprocess.Popen:
    """A process that holds `run_dir`'s lock until it is killed."""
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline().strip() == "held"
    return child
