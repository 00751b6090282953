"""Device slots of the local launcher (hydra/launcher=processes): trials side by side get one
GPU each, or disjoint cores, never the same device. The plan is a pure function of the
cores and GPUs; a sweep on this CPU (tests/test_optuna_sweeper.py) shows the slots at work."""

from __future__ import annotations

import os

import pytest
import torch

# Names are read through the module at call time: Hydra's plugin scan (any earlier test that
# composes a config) executes plugin modules again, which rebinds the module's classes.
from hydra_plugins.gearshift_launcher import _slots as plugin


def test_two_trials_on_two_cores_get_one_core_each_and_no_gpu():
    assert plugin.plan_slots(2, [0, 1], []) == [
        plugin.Slot(0, (0,), None),
        plugin.Slot(1, (1,), None),
    ]


@pytest.mark.parametrize(("n", "cores"), [(3, 8), (2, 5), (4, 4), (3, 16)])
def test_cores_are_split_into_disjoint_runs_that_use_every_core(n, cores):
    usable = [c * 2 for c in range(cores)]  # an affinity need not be 0..N-1
    slots = plugin.plan_slots(n, usable, [])
    sizes = [len(s.cores) for s in slots]
    assert [s.index for s in slots] == list(range(n))
    assert sorted(c for s in slots for c in s.cores) == usable  # disjoint, none left out
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("gpus", [["0", "1", "2", "3"], ["5", "2"], ["GPU-3f1a", "GPU-77b0"]])
def test_with_gpus_each_trial_gets_one_of_the_visible_ones(gpus):
    slots = plugin.plan_slots(len(gpus), range(16), gpus)
    assert [s.gpus for s in slots] == [(g,) for g in gpus]  # as CUDA_VISIBLE_DEVICES named them
    assert plugin.slot_setup(slots[1])[-1] == f"export CUDA_VISIBLE_DEVICES={gpus[1]}"
    fewer = plugin.plan_slots(2, range(16), ["0", "1", "2", "3"])
    assert [s.gpus for s in fewer] == [("0",), ("1",)]  # one GPU per trial, the rest idle


def test_one_slot_is_the_whole_machine():
    assert plugin.plan_slots(1, [0, 1, 2], ["0", "1"]) == [plugin.Slot(0, (0, 1, 2), ("0", "1"))]
    assert plugin.plan_slots(1, [0, 1], []) == [plugin.Slot(0, (0, 1), None)]


@pytest.mark.parametrize(
    ("n", "cores", "gpus", "message"),
    [
        (3, 2, [], "hydra.sweeper.n_jobs=3 is not allowed with hydra/launcher=processes on 2 cores"),
        (3, 16, ["0", "1"], "hydra.sweeper.n_jobs=3 is not allowed with hydra/launcher=processes on 2 GPUs"),
        (0, 2, [], "hydra.sweeper.n_jobs=0 is not allowed"),
    ],
)  # fmt: skip
def test_more_trials_than_devices_is_refused_with_the_key_and_the_limit(n, cores, gpus, message):
    with pytest.raises(plugin.SlotError, match=message):
        plugin.plan_slots(n, range(cores), gpus)


def test_a_slot_sets_the_threads_and_the_devices_of_its_job():
    assert plugin.slot_setup(plugin.Slot(1, (4, 5, 6), None)) == ["export OMP_NUM_THREADS=3"]
    assert plugin.slot_setup(plugin.Slot(0, (0,), ("7",))) == [
        "export OMP_NUM_THREADS=1",
        "export CUDA_VISIBLE_DEVICES=7",
    ]


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 1")
    assert plugin.visible_gpus() == ["3", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert plugin.visible_gpus() == []
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert plugin.visible_gpus() == [str(i) for i in range(torch.cuda.device_count())]


def test_entering_a_slot_pins_the_process_and_its_threads():
    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    core = min(before)
    try:
        plugin.enter_slot(plugin.Slot(0, (core,), None))
        assert os.sched_getaffinity(0) == {core} and torch.get_num_threads() == 1
    finally:
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)
