"""profile=on: a Chrome trace of the active steps, ops.txt by self time, the profiled steps
left out of the throughput figures."""

from __future__ import annotations

import gzip
import json
import time

import pytest
import torch
from helpers import make_cfg

from gearshift.observe.profiler import ProfiledMeter
from train import fit


def test_profile_writes_a_trace_and_ops_and_leaves_its_steps_out_of_throughput(
    tmp_path, monkeypatch
):
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):  # W&B offline, as in CI
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    # An MLP at a batch where its matmuls weigh; 8 steps: 1 warm-up, 1 wait,
    # then the profiler's warm-up step and 2 active ones (steps 4 and 5).
    cfg = make_cfg(
        "model=mlp", "profile=on", "batch_size=256", "max_steps=8", "warmup_steps=1",
        "profile.wait=1", "profile.warmup=1", "profile.active=2", "log_every_n_steps=4",
        "logger=wandb",
    )  # fmt: skip
    result = fit(cfg, tmp_path)
    summary = result.summary
    assert summary["profile"] == {
        "trace": "profile/trace.json.gz",
        "ops": "profile/ops.txt",
        "steps": [4, 5],
    }
    # throughput: 8 steps - 1 warm-up - 3 profiled (the profiler's warm-up and active ones)
    assert result.steady.steps == 4 and result.steady.samples == 4 * 256
    assert len(result.steady.step_ms) == 4

    trace = json.loads(gzip.decompress((tmp_path / summary["profile"]["trace"]).read_bytes()))
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
    assert len(steps) == 2  # the active steps only
    start = min(s["ts"] for s in steps)
    end = max(s["ts"] + s["dur"] for s in steps)
    matmuls = [e for e in events if e["name"] in ("aten::addmm", "aten::mm")]
    assert len(matmuls) >= 2 * 3 * 2  # 3 Linear layers, forward and backward, 2 steps
    assert all(start <= e["ts"] and e["ts"] + e["dur"] <= end for e in matmuls)

    ops = (tmp_path / summary["profile"]["ops"]).read_text().splitlines()
    assert ops[0].split()[:2] == ["operator", "calls"]
    # the matmuls are in the table; which op is heaviest is the machine's (a busy core can
    # stretch an add past them), so the order is checked by the times themselves
    assert {"aten::addmm", "aten::mm"} & {line.split()[0] for line in ops[1:]}
    assert not any(line.startswith("ProfilerStep") for line in ops)
    self_ms = [float(line.split()[-3]) for line in ops[1:]]
    assert self_ms == sorted(self_ms, reverse=True)

    # W&B (offline) got the same table
    [table_file] = tmp_path.glob("wandb/offline-run-*/files/media/table/profile/ops_*.table.json")
    table = json.loads(table_file.read_text())
    assert table["columns"] == ["operator", "calls", "self CPU ms", "total ms", "self %"]
    assert len(table["data"]) == len(ops) - 1 and table["data"][0][0] == ops[1].split()[0]


def test_meter_leaves_out_a_window_of_steps():
    meter = ProfiledMeter(torch.device("cpu"), warmup_steps=1, window=range(3, 5))  # slow steps
    for step in range(1, 7):
        meter.add_data_wait(0.001)
        if step in (3, 4):
            time.sleep(0.05)
        meter.step(samples=10)
        if step in (1, 4):  # log steps: after warm-up, and inside the window's end
            meter.flush()
    everything = meter.flush()
    steady = meter.steady_state()
    assert steady.steps == 6 - 1 - 2 and steady.samples == 30 and len(steady.step_ms) == 3
    assert everything.steps == 2  # the interval a log step reports keeps every step
    assert meter.everything.steps == 6
    # the left-out steps' time went with them: at least their sleeps
    assert meter.everything.seconds - meter.steady.seconds >= 0.1
    assert steady.data_wait_seconds < meter.everything.data_wait_seconds


@pytest.mark.gpu
def test_profile_on_cuda_records_the_kernels_and_ranks_by_cuda_time(tmp_path):
    cfg = make_cfg("device=cuda", "model=mlp", "profile=on", "max_steps=10", "warmup_steps=2")
    summary = fit(cfg, tmp_path).summary
    trace = json.loads(gzip.decompress((tmp_path / summary["profile"]["trace"]).read_bytes()))
    assert any(e.get("cat") == "kernel" for e in trace["traceEvents"])
    ops = (tmp_path / summary["profile"]["ops"]).read_text().splitlines()
    assert "self CUDA ms" in ops[0] and float(ops[1].split()[-3]) > 0
