"""batch_size=auto: the largest multiple of 8 that fits, on CPU within a (faked) memory budget."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from helpers import ROOT, free_port, make_cfg, start_ranks, task_of
from test_distributed import two_ranks

from gearshift import batch_finder
from gearshift.batch_finder import (
    GIB,
    TensorMemory,
    _Probe,
    agree_across_ranks,
    find_batch_size,
    largest_fitting,
    measure_cpu_memory,
    measure_step_memory,
)
from gearshift.config import ConfigError, check_config
from gearshift.evaluate import evaluate_checkpoint
from gearshift.state.checkpoint_folders import latest_checkpoint
from gearshift.state.checkpoint_reads import load_checkpoint
from train import fit

CPU = torch.device("cpu")


def auto_cfg(*overrides: str):
    return make_cfg("model=simple_cnn", "batch_size=auto", *overrides)


def finder_nodes(cfg) -> tuple:
    """What find_batch_size reads of the config: the finder's, the model's and the
    optimizer's nodes."""
    return cfg.batch_size_finder, cfg.model, cfg.optimizer


def test_cpu_choice_is_the_largest_multiple_of_8_within_a_faked_budget():
    budget_gib = 0.01  # ~10 MiB: the faked memory limit
    cfg = auto_cfg(f"batch_size_finder.max_memory_gib={budget_gib}")
    choice = find_batch_size(*finder_nodes(cfg), task_of(cfg), CPU, None, torch.contiguous_format)
    n, budget = choice.batch_size, budget_gib * GIB
    assert n % 8 == 0 and 8 <= n < 256  # the budget, not the 256-sample dataset, bounds it
    assert choice.bound == "memory_budget" and choice.budget_bytes == int(budget)

    # A real step at the chosen size stays within the budget; 8 more would not, with the margin.
    probe = _Probe(cfg.model, cfg.optimizer, task_of(cfg), CPU, None, torch.contiguous_format)
    probe.steps(8, count=1)  # optimizer state in place, as in training
    held = sum(t.untyped_storage().nbytes() for t in probe.model.parameters())
    held += sum(t.untyped_storage().nbytes() for t in probe.model.buffers())
    held += sum(
        t.untyped_storage().nbytes()
        for optimizer in probe.optimizers.optimizers
        for state in optimizer.state.values()
        for t in state.values()
        if torch.is_tensor(t)
    )
    peak = held + max(measure_step_memory(probe, n))
    assert peak <= budget
    model = measure_cpu_memory(
        cfg.model, cfg.optimizer, task_of(cfg), None, torch.contiguous_format
    )
    assert model.peak(n) == pytest.approx(peak)  # the estimate is the measurement
    assert model.peak(n + 8) * (1 + cfg.batch_size_finder.margin) > budget


def test_a_larger_budget_allows_a_larger_batch():
    sizes = [
        find_batch_size(
            *finder_nodes(cfg := auto_cfg(f"batch_size_finder.max_memory_gib={gib}")),
            task_of(cfg),
            CPU,
            None,
            torch.contiguous_format,
        ).batch_size
        for gib in (0.006, 0.012)
    ]
    assert sizes[0] < sizes[1]


def test_the_dataset_caps_the_size_when_memory_is_plenty():
    cfg = auto_cfg()  # default budget: half the RAM available
    choice = find_batch_size(
        *finder_nodes(cfg), task_of(cfg), CPU, None, torch.contiguous_format, num_samples=100
    )
    assert choice.batch_size == 96 and choice.bound == "dataset"
    assert choice.budget_bytes > 0.01 * GIB


def test_a_budget_too_small_for_8_samples_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"batch_size=auto: 8 samples need about .* GiB"):
        cfg = auto_cfg("batch_size_finder.max_memory_gib=0.0001")
        find_batch_size(*finder_nodes(cfg), task_of(cfg), CPU, None, torch.contiguous_format)


def test_tensor_memory_counts_activations_until_they_are_freed():
    with TensorMemory() as memory:
        a = torch.ones(1024)  # 4 KiB
        b = a * 2  # 4 KiB more
        view = b[:10]  # a view: nothing new
        del a
        after_free = memory.current
    assert memory.peak == 8192 and after_free == 4096
    assert view.sum() == 20


@pytest.mark.parametrize("limit", [8, 96, 100, 1000, 4096])
def test_search_finds_the_largest_multiple_of_8_that_does_not_run_out_of_memory(limit):
    tried = []

    def fits(n):  # a device with room for `limit` samples: beyond, the step runs out of memory
        tried.append(n)
        try:
            if n > limit:
                raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
            return True
        except torch.OutOfMemoryError:
            return False

    cap = 2048
    found = largest_fitting(fits, cap)
    assert found == min(cap, limit // 8 * 8)
    assert all(n % 8 == 0 and n <= cap for n in tried)
    assert len(tried) <= 2 * 9  # doubling, then bisection: logarithmic


def test_search_returns_zero_when_nothing_fits():
    assert largest_fitting(lambda n: False, 512) == 0


def test_fit_with_batch_size_auto_records_the_chosen_size(tmp_path):
    cfg = auto_cfg("batch_size_finder.max_memory_gib=0.01", "max_steps=2", "warmup_steps=0")
    result = fit(cfg, tmp_path)
    written = json.loads((tmp_path / "summary.json").read_text())
    chosen = written["gears"]["batch_size"]
    assert isinstance(chosen, int) and chosen % 8 == 0 and 8 <= chosen < 256
    assert written["batch_size_finder"]["batch_size"] == chosen
    assert written["samples"] == 2 * chosen  # the loop really trained at that size
    assert result.summary["batch_size_finder"]["bound"] == "memory_budget"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("batch_size=huge", "batch_size='huge' is not allowed; expected an integer >= 1 or auto"),
        ("batch_size=1.5", "batch_size=1.5 is not allowed; expected an integer >= 1 or auto"),
        ("batch_size_finder.max_memory_gib=0", "batch_size_finder.max_memory_gib=0"),
        ("batch_size_finder.margin=1.0", "batch_size_finder.margin=1.0 is not allowed"),
        ("batch_size_finder.max_batch_size=4", "batch_size_finder.max_batch_size=4"),
    ],
)
def test_bad_batch_size_values_fail_in_one_line(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(make_cfg(override))


def test_auto_passes_the_config_check():
    check_config(make_cfg("batch_size=auto", "dataloader.drop_last=true"))


def _agree(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    size = agree_across_ranks([64, 48][rank], CPU)  # as if the ranks had different room
    Path(out, f"rank{rank}").write_text(str(size))
    dist.destroy_process_group()


def test_ranks_agree_on_the_smallest_size(tmp_path):
    start_ranks(_agree, 2, free_port(), str(tmp_path))
    assert [int((tmp_path / f"rank{r}").read_text()) for r in range(2)] == [48, 48]


def test_batch_size_auto_under_ddp_trains_both_ranks_at_one_size(tmp_path):
    overrides = ["model=simple_cnn", "batch_size=auto", "batch_size_finder.max_memory_gib=0.01"]
    ranks = two_ranks(tmp_path, [*overrides, "max_steps=2", "data.image_size=16"])
    sizes = {rank["summary"]["gears"]["batch_size"] for rank in ranks}
    assert len(sizes) == 1 and sizes.pop() % 8 == 0
    assert ranks[0]["summary"]["samples"] == 2 * 2 * ranks[0]["summary"]["gears"]["batch_size"]


def test_a_resumed_run_keeps_the_size_its_checkpoint_trained_with(tmp_path):
    first = fit(auto_cfg("batch_size_finder.max_memory_gib=0.01", "max_steps=2"), tmp_path)
    size = first.summary["gears"]["batch_size"]
    # a budget that alone would choose another size; the checkpoint's size wins
    resumed = fit(
        auto_cfg("batch_size_finder.max_memory_gib=0.02", "max_steps=4", "resume=auto"), tmp_path
    ).summary
    assert resumed["gears"]["batch_size"] == size
    assert resumed["batch_size_finder"]["bound"] == "resumed_checkpoint"
    assert resumed["steps"] == 4


def test_batch_size_auto_is_a_decision_kept_beside_the_config_never_written_into_it(
    tmp_path, monkeypatch
):
    cfg = auto_cfg("batch_size_finder.max_memory_gib=0.01", "max_steps=2")
    result = fit(cfg, tmp_path)
    size = result.summary["gears"]["batch_size"]
    assert isinstance(size, int) and size % 8 == 0
    assert cfg.batch_size == "auto"  # the composed config, as composed
    saved = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))
    assert saved["config"]["batch_size"] == "auto" and saved["decisions"]["batch_size"] == size
    assert saved["position"]["global_batch"] == size
    # evaluate builds at the size the run trained with, not a search of its own
    monkeypatch.setattr(batch_finder, "resolve_batch_size", searched)
    evaluated = evaluate_checkpoint(latest_checkpoint(tmp_path / "checkpoints"), [], ROOT / "conf")
    assert evaluated["gears"]["batch_size"] == size


def searched(*args, **kwargs):
    raise AssertionError("batch_size=auto searched again")
