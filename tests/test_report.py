"""scripts/report.py on synthetic sweep folders whose effects, noise and resolved gears are
known: every configuration lands in its class (faster, slower, within noise, did not act),
pairs are made within rounds, failed runs are listed, and W&B gets the same reading."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, load_script, seconds
from wandb_records import finished_records

MIB = 2**20

# summary.json `gears` of a baseline run of sweep=ablation on a CPU, as a run writes it
BASE_GEARS = {
    "amp": "off",
    "amp_reason": "float32: amp=off",
    "grad_scaler": False,
    "accum": 1,
    "batch_size": 64,
    "memory_format": "contiguous",
    "data_on_device": False,
    "data_decode": "host",
    "num_workers": 0,
    "num_workers_reason": "dataloader.num_workers=0",
    "pin_memory": False,
    "non_blocking": False,
    "prefetch_to_device": False,
    "device_transforms": "off",
    "checkpointing": False,
    "compile": "off",
    "compile_reason": "compile.enabled=false",
    "cudnn_benchmark": False,
    "deterministic": False,
    "matmul_precision": "highest",
    "optimizer": "sgd",
    "fused": False,
    "foreach": None,
    "set_to_none": False,
    "distributed": "none",
}
AMP_FLOAT32 = (
    "float32: bf16 measured 1.39x slower than float32 (matmul 145x, conv 0.72x) on this CPU "
    "(AVX512, native bf16 kernels)"
)
AMP_BF16 = "bf16: measured 1.4x float32 (matmul 1.94x, conv 1.4x) on this CPU (AVX512, native bf16 kernels)"
AUTO_WORKERS = (
    "auto: training on the CPU, 2 compute thread(s) on 2 CPUs leave 0 free for workers (at most 4)"
)
# what each gear of the ablation resolves to on a 2-core CPU where bf16 is slower
RESOLVED = {
    "baseline": {},
    "amp": {"amp_reason": AMP_FLOAT32},  # amp=on -> float32: the baseline's settings
    "channels_last": {"memory_format": "channels_last"},
    "compile": {"compile": "default", "compile_reason": "compile.enabled=true"},
    "cudnn_benchmark": {"cudnn_benchmark": True},  # reported as set, acts on CUDA only
    "dataloader": {"num_workers_reason": AUTO_WORKERS, "non_blocking": True},  # auto -> 0
    "set_to_none": {"set_to_none": True},
    "all": {"memory_format": "channels_last", "set_to_none": True, "cudnn_benchmark": True},
}


def gears(name: str, **changes) -> dict:
    return {**BASE_GEARS, **RESOLVED[name], **changes}


def summary(
    samples_per_sec: float,
    peak_mib: float,
    gear_settings: dict,
    device: str = "cpu",
    step_ms: float | None = None,
) -> dict:
    return {
        "samples_per_sec": samples_per_sec,
        "samples_per_sec_per_device": samples_per_sec,
        "step_time_ms": step_ms or 64_000 / samples_per_sec,
        "data_wait_pct": 2.0,
        "peak_memory_bytes": int(peak_mib * MIB),
        "peak_memory_kind": "cpu_rss",
        "final_loss": 1.5,
        "steps": 50,
        "samples": 3200,
        "world_size": 1,
        "device": device,
        "gears": gear_settings,
    }


def fake_run(
    folder: Path, overrides: list[str], result: dict | None, logger: dict | None = None
) -> None:
    """A run folder as Hydra and gearshift leave it; no summary.json: the run failed."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if logger is not None:
        (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"logger": logger}))
        hydra = {"hydra": {"sweep": {"dir": str(folder.parent), "subdir": "${hydra.job.num}"}}}
        (folder / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(hydra))
    if result is not None:
        (folder / "summary.json").write_text(json.dumps(result))


# The baseline's throughput per round: the machine drifts by a third between rounds, far
# more than any gear here does, as a busy shared host can.
BASE = [400.0, 300.0, 360.0, 270.0, 330.0]
# each configuration's throughput / its round's baseline, and peak memory / the baseline's
EFFECTS = {
    "amp": ([1.22, 1.20, 1.25, 1.21, 1.23], 1.0),  # looks like an effect, resolved to float32
    "channels_last": ([1.21, 1.18, 1.24, 1.20, 1.19], 1.02),
    "compile": ([0.80, 0.84, 0.83, 0.79, 0.81], 1.30),
    "cudnn_benchmark": ([1.02, 0.97, 1.01, 0.99, 1.03], 1.0),
    "dataloader": ([1.09, 0.95, 1.04, 0.98, 1.06], 1.0),
    "set_to_none": ([1.06, 0.95, 1.04, 0.97, 1.03], 0.96),  # noise around 1.0
    "all": ([1.08, 1.12, 1.10, 1.09, 1.11], 1.05),  # less than channels_last alone
}
ORDER = ["amp", "channels_last", "compile", "baseline", "cudnn_benchmark", "dataloader"]
ORDER += ["set_to_none", "all"]


def ablation_folder(root: Path, failed=(), logger: dict | None = None, device="cpu") -> Path:
    """A sweep=ablation folder: rounds (seed) outer, gears inner, as Hydra numbers them."""
    n = 0
    for round_, base in enumerate(BASE):
        for gear in ORDER:
            ratios, memory = EFFECTS.get(gear, ([1.0] * len(BASE), 1.0))
            result = summary(base * ratios[round_], 1000 * memory, gears(gear), device)
            if (gear, round_) in failed:
                result = None
            overrides = [f"seed={round_}", f"gear={gear}", "sweep=ablation", "logger=none"]
            fake_run(root / str(n), overrides, result, logger)
            n += 1
    (root / "multirun.yaml").write_text("{}\n")  # Hydra's own file beside the runs
    return root


def report(folder: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "report.py"), *args, str(folder)],
        capture_output=True,
        text=True,
        timeout=seconds(120),
        env=env,
    )


def classes(folder: Path) -> dict[str, dict]:
    reading = json.loads((folder / "report.json").read_text())
    return {c["name"]: c for c in reading["configurations"]}


def tables(markdown: str) -> list[list[list[str]]]:
    """Each markdown table's rows (no header), as cells."""
    found, rows = [], None
    for line in [*markdown.splitlines(), ""]:
        if line.startswith("|"):
            rows = [] if rows is None else rows
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows is not None:
            found.append(rows[2:])
            rows = None
    return found


@pytest.fixture(scope="module")
def ablation(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    root = ablation_folder(
        tmp_path_factory.mktemp("multirun") / "ablation", failed={("compile", 3)}
    )
    return root, report(root, "--no-wandb")


def test_every_configuration_lands_in_its_class(ablation):
    root, done = ablation
    assert done.returncode == 0, done.stderr
    found = classes(root)
    assert {name: c["class"] for name, c in found.items()} == {
        "gear=baseline": "baseline",
        "gear=channels_last": "faster",  # 1.18-1.24x in every round
        "gear=all": "faster",
        "gear=compile": "slower",
        "gear=set_to_none": "within noise",  # 0.95-1.06x: its interval holds 1.0
        "gear=amp": "did not act",  # measured 1.2x, but resolved to float32
        "gear=cudnn_benchmark": "did not act",  # on a CPU
        "gear=dataloader": "did not act",  # num_workers=auto -> 0
    }
    # pairs are made within rounds: the machine's drift (400 -> 270) is gone from the figures
    cl = found["gear=channels_last"]["throughput"]
    assert (cl["median"], cl["lo"], cl["hi"], cl["n"]) == pytest.approx((1.20, 1.18, 1.24, 5))
    assert found["gear=compile"]["pairs"] == 4  # its round-3 run failed
    assert found["gear=compile"]["peak_memory"]["median"] == pytest.approx(1.30, abs=1e-3)
    step = found["gear=compile"]["step_time"]  # 64000 / samples_per_sec: the inverse ratio
    assert step["median"] == pytest.approx(1 / 0.82, abs=0.005) and not step["within_noise"]
    assert found["gear=set_to_none"]["peak_memory"]["within_noise"] is False  # 0.96x every time
    assert found["gear=set_to_none"]["throughput"]["within_noise"] is True


def test_did_not_act_says_why_from_the_resolved_gears(ablation):
    root, _ = ablation
    found = classes(root)
    assert found["gear=amp"]["did_not_act_because"] == [f"amp resolved to off ({AMP_FLOAT32})"]
    assert found["gear=cudnn_benchmark"]["did_not_act_because"] == [
        "cudnn_benchmark=true: cuDNN's autotuner acts on CUDA only (ran on cpu)"
    ]
    assert found["gear=dataloader"]["did_not_act_because"] == [
        f"num_workers resolved to 0 ({AUTO_WORKERS})",
        "non_blocking=true: no host-to-device copy to overlap (ran on cpu)",
    ]
    assert found["gear=channels_last"]["acted"] == {
        "memory_format": ["contiguous", "channels_last"]
    }
    # cudnn_benchmark is left out of what gear=all switched on this CPU
    assert set(found["gear=all"]["acted"]) == {"memory_format", "set_to_none"}


def test_noise_never_ranks_above_an_effect_and_what_did_not_act_is_apart(ablation):
    root, done = ablation
    markdown = (root / "report.md").read_text()
    ranked, idle, combos = tables(markdown)
    assert [row[0] for row in ranked] == [
        "gear=channels_last",
        "gear=all",
        "gear=baseline",
        "gear=compile",
        "gear=set_to_none",
    ]
    channels_last, _, baseline, compile_, set_to_none = ranked
    # configuration, class, pairs, samples/s, throughput, step time, peak memory, ...
    assert channels_last[1:5] == ["faster", "5", "392.7", "1.20x [1.18, 1.24]"]
    assert baseline[1:7] == ["baseline", "5", "330.0", "1.00x", "1.00x", "1.00x"]
    assert compile_[4] == "0.82x [0.80, 0.84]"  # 4 pairs (round 3 failed): their min-max
    assert set_to_none[4] == "≈1.03x [0.95, 1.06]"  # within noise
    assert set_to_none[6] == "0.96x [0.96, 0.96]"  # but its memory effect is not
    assert "rounds would resolve a 5% effect" in set_to_none[9]
    assert "step time" not in set_to_none[9]  # its step time is within noise too
    assert [row[0] for row in idle] == ["gear=amp", "gear=cudnn_benchmark", "gear=dataloader"]
    assert "CUDA only" in idle[1][4]
    assert combos == [
        [
            "gear=all",
            "1.10x [1.08, 1.12]",
            "1.20x",
            "gear=channels_last 1.20x (faster); gear=set_to_none 1.03x (within noise)",
            "less than the product of its parts: they interfere",
        ]
    ]
    assert "## Did not act here" in markdown and "did not act here" in done.stdout


def test_a_combination_beside_the_product_of_the_effects_of_its_parts(ablation):
    root, _ = ablation
    [combo] = json.loads((root / "report.json").read_text())["combinations"]
    # all = channels_last (an effect, 1.20x) + set_to_none (noise: not counted)
    assert combo["name"] == "gear=all"
    assert combo["parts"] == ["gear=channels_last", "gear=set_to_none"]
    assert combo["counted"] == ["gear=channels_last"]
    assert combo["product"] == pytest.approx(1.20)
    assert combo["measured"]["hi"] == pytest.approx(1.12) and "interfere" in combo["reading"]


def test_failed_runs_are_listed_and_the_files_written(ablation):
    root, done = ablation
    markdown = (root / "report.md").read_text()
    assert f"- gear=compile: {root / '26'}" in markdown  # round 3's compile run
    reading = json.loads((root / "report.json").read_text())
    assert reading["failed"] == [{"name": "gear=compile", "folder": str(root / "26")}]
    assert "failed runs" in done.stdout
    assert (root / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pairing_within_rounds_finds_an_effect_the_rounds_drift_would_hide(tmp_path):
    # A 10% gear on a machine whose speed halves and doubles between rounds: the runs'
    # throughputs overlap entirely, each pair's ratio is 1.10.
    base = [200.0, 400.0, 250.0, 380.0, 220.0]
    n = 0
    for round_, b in enumerate(base):
        for gear, ratio in (("baseline", 1.0), ("channels_last", 1.10)):
            result = summary(b * ratio, 1000, gears(gear))
            fake_run(tmp_path / str(n), [f"seed={round_}", f"gear={gear}"], result)
            n += 1
    done = report(tmp_path, "--no-plot", "--no-wandb")
    assert done.returncode == 0, done.stderr
    cl = classes(tmp_path)["gear=channels_last"]
    assert cl["class"] == "faster"
    assert cl["throughput"]["lo"] == pytest.approx(1.10) == cl["throughput"]["hi"]


def test_a_gear_that_acted_in_some_rounds_only_is_measured_on_those(tmp_path):
    # amp=on's probe picked bf16 in rounds 0-2 and float32 in rounds 3-4
    n = 0
    for round_, b in enumerate(BASE):
        resolved = {"amp": "bfloat16", "amp_reason": AMP_BF16} if round_ < 3 else {}
        for gear, ratio, settings in (
            ("baseline", 1.0, gears("baseline")),
            ("amp", 1.4 if round_ < 3 else 1.0, gears("amp", **resolved)),
        ):
            fake_run(
                tmp_path / str(n),
                [f"seed={round_}", f"gear={gear}"],
                summary(b * ratio, 900, settings),
            )
            n += 1
    done = report(tmp_path, "--no-plot", "--no-wandb")
    assert done.returncode == 0, done.stderr
    amp = classes(tmp_path)["gear=amp"]
    assert (amp["class"], amp["pairs"], amp["idle_pairs"]) == ("faster", 3, 2)
    assert amp["varied_pairs"] == 0  # bf16 each time it acted
    assert amp["throughput"]["median"] == pytest.approx(1.4)
    assert amp["did_not_act_because"] == [f"amp resolved to off ({AMP_FLOAT32})"]


def test_a_pair_of_gears_that_resolved_to_one_is_named_so_and_counted_once(tmp_path):
    # amp_channels_last where amp=on resolved to float32: channels_last again
    RESOLVED["amp_channels_last"] = {**RESOLVED["amp"], **RESOLVED["channels_last"]}
    n = 0
    for round_, b in enumerate(BASE[:3]):
        for gear, ratio in (
            ("amp_channels_last", 1.19),
            ("channels_last", 1.2),
            ("baseline", 1.0),
            ("set_to_none", 0.9),
            ("all", (1.05, 1.08, 1.11)[round_]),
        ):
            result = summary(b * ratio, 1000, gears(gear))
            fake_run(tmp_path / str(n), [f"seed={round_}", f"gear={gear}"], result)
            n += 1
    del RESOLVED["amp_channels_last"]
    done = report(tmp_path, "--no-plot", "--no-wandb")
    assert done.returncode == 0, done.stderr
    found = classes(tmp_path)
    assert found["gear=amp_channels_last"]["same_as"] == "gear=channels_last"
    assert found["gear=amp_channels_last"]["varied_pairs"] == 0
    assert found["gear=channels_last"]["same_as"] is None
    [combo] = json.loads((tmp_path / "report.json").read_text())["combinations"]
    assert combo["parts"] == ["gear=channels_last", "gear=set_to_none"]
    assert combo["product"] == pytest.approx(1.2 * 0.9)  # both effects (3 pairs, min-max)
    assert "as the product of its parts" in combo["reading"]


def test_a_steady_step_time_is_named_when_stalls_blur_the_throughput(tmp_path):
    # the baseline's run of round 1 stalled: its throughput fell, its median step did not
    throughput = [0.92, 1.25, 0.78, 0.81, 0.79]
    step = [1.23, 1.05, 1.28, 1.24, 1.28]
    for round_, b in enumerate(BASE):
        runs = (("baseline", 1.0, 1.0), ("compile", throughput[round_], step[round_]))
        for i, (gear, ratio, step_ratio) in enumerate(runs):
            result = summary(b * ratio, 1000, gears(gear), step_ms=100 * step_ratio)
            fake_run(tmp_path / str(2 * round_ + i), [f"seed={round_}", f"gear={gear}"], result)
    done = report(tmp_path, "--no-plot", "--no-wandb")
    assert done.returncode == 0, done.stderr
    assert classes(tmp_path)["gear=compile"]["class"] == "within noise"
    [compile_] = [
        r for r in tables((tmp_path / "report.md").read_text())[0] if r[0] == "gear=compile"
    ]
    assert "its median step time is slower: 1.24x [1.05, 1.28]" in compile_[9]


def test_a_gear_whose_resolution_varied_between_rounds_says_in_how_many(tmp_path):
    bf16 = {"amp": "bfloat16", "amp_reason": AMP_BF16, "memory_format": "channels_last"}
    float32 = {"amp_reason": AMP_FLOAT32, "memory_format": "channels_last"}  # the probe lost
    for round_, b in enumerate(BASE[:3]):
        resolved = float32 if round_ == 1 else bf16
        runs = (("baseline", 1.0, gears("baseline")), ("pair", 1.3, {**BASE_GEARS, **resolved}))
        for i, (gear, ratio, settings) in enumerate(runs):
            result = summary(b * ratio, 1000, settings)
            fake_run(tmp_path / str(2 * round_ + i), [f"seed={round_}", f"gear={gear}"], result)
    done = report(tmp_path, "--no-plot", "--no-wandb")
    assert done.returncode == 0, done.stderr
    pair = classes(tmp_path)["gear=pair"]
    assert (pair["pairs"], pair["varied_pairs"], pair["idle_pairs"]) == (3, 1, 0)
    assert pair["acted"]["amp"] == ["off", "bfloat16"]  # what it resolved to first
    assert "its gears resolved otherwise in 1 round(s)" in (tmp_path / "report.md").read_text()


def test_cudnn_benchmark_acts_on_cuda(tmp_path):
    ablation_folder(tmp_path, device="cuda:0")
    done = report(tmp_path, "--no-plot", "--no-wandb")
    assert done.returncode == 0, done.stderr
    found = classes(tmp_path)
    assert found["gear=cudnn_benchmark"]["class"] == "within noise"  # acted, bought nothing
    assert found["gear=cudnn_benchmark"]["acted"] == {"cudnn_benchmark": [False, True]}
    assert found["gear=dataloader"]["acted"] == {"non_blocking": [False, True]}
    assert found["gear=amp"]["class"] == "did not act"  # its resolved gears say so anywhere


def test_too_few_rounds_tell_no_effect(tmp_path):
    for n, (gear, ratio) in enumerate((("baseline", 1.0), ("compile", 0.5))):
        fake_run(
            tmp_path / str(n), ["seed=0", f"gear={gear}"], summary(300 * ratio, 1000, gears(gear))
        )
    done = report(tmp_path, "--no-plot", "--no-wandb")
    assert done.returncode == 0, done.stderr
    compile_ = classes(tmp_path)["gear=compile"]
    assert compile_["class"] == "within noise" and compile_["pairs"] == 1
    assert "1 pair: no spread to go by" in (tmp_path / "report.md").read_text()


def test_a_run_whose_round_has_no_baseline_run_is_left_unpaired(tmp_path):
    ablation_folder(tmp_path, failed={("baseline", 2)})
    done = report(tmp_path, "--no-plot", "--no-wandb")
    assert done.returncode == 0, done.stderr
    found = classes(tmp_path)
    assert found["gear=channels_last"]["pairs"] == 4
    assert found["gear=channels_last"]["unpaired"] == 1
    assert "1 run(s) without a baseline run in their round" in (tmp_path / "report.md").read_text()


def test_the_interval_holds_the_median_with_the_probability_it_claims():
    effects = load_script("report_effects")
    # min-max below 5 pairs; the k-th from each end where that reaches 90%
    assert [effects.interval_rank(n) for n in (3, 4, 5, 7, 8, 10, 12, 20)] == [
        1, 1, 1, 1, 2, 2, 3, 6
    ]  # fmt: skip
    assert effects.coverage(3, 1) == 0.75 and effects.coverage(5, 1) == 0.9375
    assert effects.coverage(8, 2) == pytest.approx(1 - 2 * 9 / 256)
    assert effects.describe_interval(3) == "min-max of 3 pairs (75% interval)"
    assert effects.describe_interval(8) == "2nd smallest to 2nd largest of 8 pairs (93% interval)"


def test_rounds_to_resolve_five_percent_grow_with_the_spread():
    effects = load_script("report_effects")

    def spread(s: float) -> list[float]:  # log ratios of standard deviation s
        return [math.log(1 + s * z) for z in (-1.0, 0.0, 1.0)]

    needed = [effects.rounds_to_resolve(spread(s)) for s in (0.005, 0.02, 0.05, 0.10)]
    assert needed[0] == effects.MIN_PAIRS  # a tight spread: the fewest rounds that tell
    assert needed == sorted(needed) and needed[-1] > 20
    assert effects.rounds_to_resolve(spread(0.05), effect=0.10) < needed[2]  # a bigger effect
    assert effects.rounds_to_resolve([0.01]) == 1000  # one pair: no spread to go by
    assert effects.rounds_to_resolve(spread(0.9)) == 1000  # a busy machine's spread: too many


def test_the_report_reads_to_the_sweeps_wandb_group(tmp_path):
    root = tmp_path / "multirun" / "ablation_x"
    logger = {"wandb": True, "project": "gearshift", "entity": None, "mode": "offline"}
    ablation_folder(root, logger={**logger, "group": None, "tags": []})
    env = {**__import__("os").environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    env["HOME"] = str(tmp_path)
    env.pop("WANDB_API_KEY", None)
    done = report(root, "--no-plot", env=env)
    assert done.returncode == 0, done.stderr
    [log] = root.glob("wandb/offline-run-*/run-*.wandb")
    records = finished_records(log)
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert (run.run_group, run.display_name, run.job_type) == (
        "ablation_x",
        "gear report",
        "report",
    )
    [table] = log.parent.glob("files/media/table/gear_report/effects_*.table.json")
    rows = json.loads(table.read_text())
    assert rows["columns"][:2] == ["configuration", "class"]
    assert {r[0]: r[1] for r in rows["data"]}["gear=set_to_none"] == "within noise"
    [idle] = log.parent.glob("files/media/table/gear_report/did_not_act_*.table.json")
    assert [r[0] for r in json.loads(idle.read_text())["data"]][:1] == ["gear=amp"]
    summary_keys = {
        item.key: json.loads(item.value_json)
        for r in records
        if r.WhichOneof("record_type") == "summary"
        for item in r.summary.update
        if item.key
    }
    assert summary_keys["gear_report/gear=compile/class"] == "slower"


def test_report_of_a_folder_without_runs_is_one_clear_error(tmp_path):
    done = report(tmp_path)
    assert done.returncode != 0
    assert done.stderr.strip() == f"error: no run folders (with .hydra/) under {tmp_path}"
    assert not (tmp_path / "report.md").exists()
