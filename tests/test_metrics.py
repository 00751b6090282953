"""summary.json carries every documented key with sensible values, measured without host syncs."""

from __future__ import annotations

import json
import time

import pytest
import torch
import torch.nn.functional as F
from helpers import (
    TIME_FACTOR,
    TINY,
    SyncCounter,
    check_amp_on_resolved,
    check_summary,
    make_cfg,
    only_summary,
    record_logs,
    run_train,
)
from torch import nn

from gearshift.observe.throughput import PerfMeter
from gearshift.tasks import Classification
from train import fit


def test_summary_json_has_every_key_with_sensible_values(tmp_path):
    result = fit(make_cfg("model=mlp", "max_steps=12", "accum=2"), tmp_path)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written == json.loads(json.dumps(result.summary))
    check_summary(written, steps=12, samples=12 * 2 * 16)
    # throughput and step time describe the same steps: the throughput's seconds hold at
    # least those steps' times (at least half of them last the median or longer), and not
    # much more (warm-up's seconds left out); a busy machine's slow steps move the mean
    # from the median by a few x, so that bound scales with the machine
    per_step = written["samples"] / written["steps"]
    implied_ms = 1000 * per_step / written["samples_per_sec"]
    assert 0.45 < implied_ms / written["step_time_ms"] < 3 * TIME_FACTOR


def test_no_validation_data_gives_null_val_metrics(tmp_path):
    summary = fit(make_cfg("model=mlp", "max_steps=2", "data.num_val_samples=0"), tmp_path).summary
    assert summary["val_loss"] is None and summary["val_accuracy"] is None


def test_acceptance_command_writes_a_full_summary(tmp_path):
    # The README's gears on the smallest conv model and images that show them acting: what
    # amp=on costs depends on the CPU (bf16 is emulated on some), and no pass may depend on it.
    result = run_train(
        *("amp=on", "accum=4", "memory_format=channels_last", "dataloader=tuned"),
        *("model=simple_cnn", *TINY, "max_steps=5", "warmup_steps=1"),
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = only_summary(tmp_path)
    check_summary(summary, steps=5, samples=5 * 4 * 16)
    gears = summary["gears"]
    assert gears["accum"] == 4
    check_amp_on_resolved(gears)
    assert gears["memory_format"] == "channels_last" and gears["non_blocking"] is True
    run_dir = next((tmp_path / "runs").iterdir())
    assert (run_dir / ".hydra" / "config.yaml").exists() and (run_dir / "train.log").exists()
    log = (run_dir / "train.log").read_text()
    assert "samples/s" in log and gears["amp_reason"] in log


def test_steady_state_leaves_out_the_warmup_steps():
    meter = PerfMeter(torch.device("cpu"), warmup_steps=2)
    for pause in (0.08, 0.08):  # slow warm-up (a compile, say)
        time.sleep(pause)
        meter.step(samples=10)
    meter.flush()
    for _ in range(4):
        time.sleep(0.01)
        meter.step(samples=10)
    meter.flush()
    steady = meter.steady_state()
    assert steady.steps == 4 and steady.samples == 40
    assert steady.median_step_ms < 60  # the 80 ms warm-up steps are not in it
    assert steady.samples_per_sec > 40 / 0.2


def test_data_wait_share_counts_time_waiting_for_batches():
    meter = PerfMeter(torch.device("cpu"), warmup_steps=0)
    for _ in range(3):
        meter.add_data_wait(0.02)
        time.sleep(0.03)  # the wait itself, then compute
        meter.step(samples=1)
    pct = meter.flush().data_wait_pct
    assert 10 < pct < 80


def host_reads(monkeypatch, tmp_path, max_steps: int, *gears: str) -> int:
    """Host reads of tensor values in a run of `max_steps` steps, logging every 10."""
    steps = (f"max_steps={max_steps}", "log_every_n_steps=10", "warmup_steps=5")
    cfg = make_cfg("model=mlp", *steps, *gears)
    reads = SyncCounter(monkeypatch)
    fit(cfg, tmp_path)
    return reads.count


@pytest.mark.parametrize("amp", ["off", "bf16"])  # bf16 (CPU autocast): no scaler, no more reads
@pytest.mark.parametrize("max_steps", [20, 40])
def test_host_reads_tensors_only_at_log_steps(tmp_path, monkeypatch, max_steps, amp):
    reads = host_reads(monkeypatch, tmp_path, max_steps, f"amp={amp}")
    log_points = max_steps // 10 + 1  # every 10 steps, plus the end of warm-up
    # one loss read per log point; validation reads one; best/ (the one validation is the
    # best so far) one: its weights and loss are checked finite before it is saved, and the
    # checkpoint at the end, at the same step, is that file
    assert reads == log_points + 1 + 1


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("max_steps", [20, 40])
def test_fp16_reads_its_found_inf_flag_every_step_unless_the_optimizer_is_fused(
    tmp_path, monkeypatch, max_steps, fused
):
    # fp16's GradScaler (CPU autocast here; the same code on CUDA, where each read is a sync)
    reads = host_reads(monkeypatch, tmp_path, max_steps, "amp=fp16", f"optimizer.fused={fused}")
    log_points = max_steps // 10 + 1
    # what float32 reads (above); at each log point the loss scale and the skipped-step
    # count beside the loss; the scaler's state (scale, growth tracker) in the checkpoint
    expected = (log_points + 1 + 1) + 2 * log_points + 2
    # GradScaler.step reads found_inf (.item()) every step to decide whether to step; a fused
    # optimizer takes it as a tensor and skips on the device
    per_step = 0 if fused else 1
    assert reads == expected + per_step * max_steps


def test_a_pause_between_log_steps_keeps_the_steps_and_leaves_out_its_time():
    # validation every 2 steps, logging every 4: the steps before a validation stay in the
    # interval (its loss is averaged over them), the validation's time does not
    meter = PerfMeter(torch.device("cpu"), warmup_steps=0)
    start = time.perf_counter()
    for _ in range(2):
        meter.step(samples=10)
    time.sleep(0.1)  # validation
    meter.resume()
    for _ in range(2):
        meter.step(samples=10)
    interval = meter.flush()
    wall = time.perf_counter() - start
    assert interval.steps == 4 and interval.samples == 40 and len(interval.step_ms) == 4
    assert interval.seconds <= wall - 0.1
    assert sum(interval.step_ms) <= 1000 * wall - 100  # no step's time holds the pause
    assert meter.steady_state().steps == 4


def test_a_pause_right_after_a_slow_log_step_leaves_the_next_interval_its_steps_time():
    # The pause (a validation) starts at the last step's mark, before the slow log step's
    # read ended and the next interval began: the interval still has its step's time.
    meter = PerfMeter(torch.device("cpu"), warmup_steps=0)
    meter.step(samples=10)
    time.sleep(0.05)  # the log step's read and logging, after the step's mark
    meter.flush()
    meter.resume()  # a validation at once, before any step
    time.sleep(0.002)
    meter.step(samples=10)
    interval = meter.flush()
    assert interval.steps == 1 and interval.seconds >= interval.step_ms[0] / 1000 > 0
    assert interval.samples_per_sec == 10 / interval.seconds


RETURNED: list[torch.Tensor] = []  # AuxTerms's terms, call after call


class AuxTerms(Classification):
    """A loss with a term logged beside it; it keeps each term (a device copy, no host read)."""

    def loss(self, model, batch):
        inputs, targets = batch
        logits = model(inputs)
        aux = logits.float().square().mean()  # varies with the batch and the weights
        if isinstance(model, nn.Module):  # the loop's calls, not the FLOP count's function
            RETURNED.append(aux.detach().clone())
        return F.cross_entropy(logits, targets), {"aux": aux}


def test_a_term_beside_the_loss_is_logged_as_its_window_mean_in_the_same_host_read(
    tmp_path, monkeypatch
):
    RETURNED.clear()
    logs = record_logs(monkeypatch)
    reads = host_reads(monkeypatch, tmp_path, 20, "accum=2", f"task._target_={__name__}.AuxTerms")
    # no read more than a loss alone makes: the terms come in the loss's read
    assert reads == (20 // 10 + 1) + 1 + 1
    assert len(RETURNED) == 20 * 2  # every micro-batch's
    per_step = torch.stack(RETURNED).double().view(20, 2).mean(dim=1)  # a window's mean
    logged: dict[int, dict[str, float]] = {}
    for step, metrics in zip(logs.steps, logs, strict=True):
        logged.setdefault(step, {}).update(metrics)
    steps = sorted(step for step, metrics in logged.items() if "train/loss" in metrics)
    assert steps == [5, 10, 20]  # the end of warm-up, then every 10
    for first, last in zip([0, *steps[:-1]], steps, strict=True):
        expected = per_step[first:last].mean().item()
        assert logged[last]["train/aux"] == pytest.approx(expected, rel=1e-5), last


def test_meter_leaves_out_a_window_of_steps():
    meter = PerfMeter(torch.device("cpu"), warmup_steps=1)
    meter.leave_out(range(3, 5))  # steps 3 and 4: slow, profiled
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
