"""How much does the template cost? Its loop against a minimal hand-written one.

Both train the same model on batches of the same source with the same gears and the same
optimizer (built from one config); the hand-written loop cycles through 8 batches made
once, the template serves the shuffled epoch as it does in training; runs alternate (template, hand, hand, template, ...) so drift in
machine speed hits both alike, and the figure that counts is the median ratio of their
throughputs (1.0 = no overhead).

The headline is the steady-state ratio: samples over wall-clock seconds after the
warm-up, every step included, log steps too, exactly as summary.json counts
`samples_per_sec` (the hand-written loop is timed the same way). Beside it, ratios of
the fastest and the median step: the fastest step shows the template's per-step work
without a shared machine's slow stretches, but hides what log steps and stalls cost.

A second table compares the template with `dataloader.prefetch_to_device` off and on,
on host data (`data.on_device=false`): on a GPU the copy of the next batch overlaps the
compute; on a CPU the prefetcher passes batches through, so the result must be identical
and the throughput the same.

    python scripts/bench.py                       # mlp at batch 128, resnet18, the GPT
    python scripts/bench.py --cases gpt,gpt-amp   # the tiny GPT, float32 and amp=on
    python scripts/bench.py --repeats 7 amp=bf16  # extra overrides apply to both loops
    python scripts/bench.py --prefetch-repeats 0  # skip the prefetch comparison
    python scripts/bench.py --generate-repeats 0  # skip the generation comparison
    python scripts/bench.py --checkpoint-repeats 0  # skip the checkpoint comparison

A third table times generation (models/sampling.py): the tiny GPT of experiment=lm with a
context of 512 writes 256 new tokens after an 8-token prompt, greedy, with the KV cache and
without it (each token then a forward pass over the whole sequence so far), interleaved;
both must give the same tokens. The figure is the median ratio of their tokens/s.

`--cases muon` races optimizers instead (alone, it skips the loop table; add
`--prefetch-repeats 0 --generate-repeats 0` for it alone: about a minute on 2 quiet cores): the
grammar of tests/test_tokens.py (1500 sentences, characters), a 2-layer GPT 64 wide on
windows of 32, batch 16, validated every 5 steps, and for each optimizer a small lr sweep;
each run stops when its validation loss falls below the text's bigram entropy (what a
model that sees one character back reaches: below it, the model uses the context). The
table gives each run's steps to that bar; an optimizer's figure is its best lr's. Muon's
AdamW part (embeddings, head, 1-D parameters) takes AdamW's best lr.

    python scripts/bench.py --cases muon --prefetch-repeats 0 --generate-repeats 0

A fourth table times checkpoints (scripts/bench_checkpoint.py): how long a save stops the
loop, sync against `checkpoint.async_save=true`, on a GPT of 8 layers x 512 (118 MB of
weights), with the peak host memory of each.
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from itertools import islice, pairwise
from pathlib import Path

import torch
from bench_checkpoint import bench_checkpoint, print_checkpoint
from grammar import bigram_entropy, grammar_text
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from gearshift.data.loading import to_device
from gearshift.data.text import CharTokenizer, write_token_folder
from gearshift.data_batches import data_batches
from gearshift.engine.optim import build_optimizers
from gearshift.engine.precision import resolve_amp
from gearshift.engine.runtime import configure_backends, resolve_device, seed_everything
from gearshift.models.factory import build_model
from gearshift.models.gpt import GPT
from gearshift.models.sampling import generate
from gearshift.tasks import build_task

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # train.py: the loop the template trains with
from train import fit  # noqa: E402

CONF = ROOT / "conf"
CASES = {  # name: (overrides, measured steps)
    "mlp": (["model=mlp", "batch_size=128"], 100),
    "resnet18": (["model=resnet18", "batch_size=64"], 15),
    # per-step overhead laid bare: about half a millisecond of compute per step on a CPU
    "tiny": (["model=mlp", "batch_size=8", "model.hidden=64", "data.image_size=8"], 400),
    # the tiny GPT of experiment=lm (4 layers, 128 wide, windows of 64 tokens), fused AdamW;
    # with amp=on too, which takes bf16 where this CPU measures it fast (else float32)
    "gpt": (["experiment=lm", "batch_size=16", "optimizer.fused=true"], 40),
    "gpt-amp": (["experiment=lm", "batch_size=16", "optimizer.fused=true", "amp=on"], 40),
}


@dataclass
class Timing:
    step_ms: list[float]  # each measured step: the gap between consecutive step ends
    samples_per_step: float
    wall_samples_per_sec: float

    def samples_per_sec(self, statistic) -> float:
        return self.samples_per_step * 1000 / statistic(self.step_ms)


def hand_written_loop(cfg: DictConfig) -> Timing:
    """The loop a person would write by hand, timed like the template times its steps: a
    fixed pool of batches already on the device, so the template's data feeding (shuffled
    batches every epoch) counts as template overhead."""
    device = resolve_device(cfg.device)
    seed_everything(cfg.seed)
    configure_backends(device, cfg.cudnn_benchmark, cfg.matmul_precision)
    layout = torch.channels_last if cfg.memory_format.channels_last else torch.contiguous_format
    dtype = resolve_amp(cfg.amp.dtype, device).dtype  # what the template resolves it to
    autocast = partial(torch.autocast, device.type, dtype=dtype) if dtype else nullcontext
    train, _ = data_batches(cfg, device)
    pool = [to_device(b, device, False, layout) for b in islice(train, POOL)]  # no pipeline
    task = build_task(cfg.task)
    model = build_model(cfg.model, device, layout)
    optimizers = build_optimizers(model, cfg.optimizer, cfg.max_steps, scheduler=cfg.scheduler)
    step, samples, marks = 0, 0, []
    while step < cfg.max_steps:
        images, labels = pool[step % len(pool)]
        with autocast():
            loss = task.loss(model, (images, labels))  # the same loss function
        loss.backward()
        if cfg.optimizer.clip_grad_norm is not None:  # the same gears: clipping too
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optimizer.clip_grad_norm)
        optimizers.step()
        optimizers.zero_grad(set_to_none=cfg.optimizer.set_to_none)
        optimizers.step_schedules()
        step += 1
        if step == cfg.warmup_steps:
            loss.item()  # wait for the device, then start the clock
        if step > cfg.warmup_steps:
            samples += labels.shape[0]
        if step >= cfg.warmup_steps:
            marks.append(time.perf_counter())
    loss.item()
    step_ms = [1000 * (b - a) for a, b in pairwise(marks)]
    return Timing(step_ms, samples / len(step_ms), samples / (time.perf_counter() - marks[0]))


def template_loop(cfg: DictConfig) -> Timing:
    """gearshift's own loop, timed by its own meter (steps after the warm-up)."""
    with tempfile.TemporaryDirectory() as run_dir:
        steady = fit(cfg, Path(run_dir)).steady
    return Timing(steady.step_ms, steady.samples / steady.steps, steady.samples_per_sec)


POOL = 8  # batches the hand-written loop cycles through
STATISTICS = {"best step": min, "median step": statistics.median}
STEADY = "steady state"  # samples / wall-clock seconds after the warm-up, as summary.json


def bench_case(name: str, overrides: list[str], steps: int, repeats: int) -> dict:
    warmup = 10 if name == "mlp" else 5
    common = ["logger=none", "progress_bar=false", f"warmup_steps={warmup}"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[*common, f"max_steps={warmup + steps}", *overrides])
    for _ in range(2):  # untimed: first-run costs (kernel caches, allocator, page cache)
        template_loop(cfg), hand_written_loop(cfg)
    throughput: dict[str, list[float]] = {"template": [], "hand": []}
    ratios: dict[str, list[float]] = {key: [] for key in [STEADY, *STATISTICS]}
    for repeat in range(repeats):
        order = ("template", "hand") if repeat % 2 == 0 else ("hand", "template")
        timing = {
            w: template_loop(cfg) if w == "template" else hand_written_loop(cfg) for w in order
        }
        t, h = timing["template"], timing["hand"]
        for key, statistic in STATISTICS.items():
            ratios[key].append(t.samples_per_sec(statistic) / h.samples_per_sec(statistic))
        ratios[STEADY].append(t.wall_samples_per_sec / h.wall_samples_per_sec)
        throughput["template"].append(t.wall_samples_per_sec)
        throughput["hand"].append(h.wall_samples_per_sec)
        logging.info(
            "%s repeat %d: %s",
            name,
            repeat + 1,
            ", ".join(f"{key} {values[-1]:.3f}" for key, values in ratios.items()),
        )
    device = resolve_device(cfg.device)
    return {
        "case": name,
        "amp": str(resolve_amp(cfg.amp.dtype, device).dtype or "off").removeprefix("torch."),
        "tokens_per_sample": build_task(cfg.task).tokens_per_sample,
        "template": statistics.median(throughput["template"]),
        "hand": statistics.median(throughput["hand"]),
        **{key: statistics.median(values) for key, values in ratios.items()},
        "range": (min(ratios[STEADY]), max(ratios[STEADY])),
    }


PREFETCH_CASE = ["model=mlp", "batch_size=128", "data.on_device=false"]
PREFETCH_CASE += ["dataloader.pin_memory=auto", "dataloader.non_blocking=true"]


def bench_prefetch(overrides: list[str], steps: int, repeats: int) -> dict:
    """The template on host data with prefetch_to_device off and on, interleaved."""
    common = ["logger=none", "progress_bar=false", "warmup_steps=5", f"max_steps={5 + steps}"]
    configs = {}
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for mode, flag in (("off", "false"), ("on", "true")):
            prefetch = f"dataloader.prefetch_to_device={flag}"
            configs[mode] = compose(
                "config", overrides=[*common, *PREFETCH_CASE, *overrides, prefetch]
            )
    ratios: dict[str, list[float]] = {key: [] for key in [STEADY, *STATISTICS]}
    throughput: dict[str, list[float]] = {"off": [], "on": []}
    identical = True
    for repeat in range(repeats):
        order = ("off", "on") if repeat % 2 == 0 else ("on", "off")
        results, timing = {}, {}
        for mode in order:
            with tempfile.TemporaryDirectory() as run_dir:
                results[mode] = fit(configs[mode], Path(run_dir))
            steady = results[mode].steady
            timing[mode] = Timing(
                steady.step_ms, steady.samples / steady.steps, steady.samples_per_sec
            )
            throughput[mode].append(timing[mode].samples_per_sec(min))
        on, off = timing["on"], timing["off"]
        for key, statistic in STATISTICS.items():
            ratios[key].append(on.samples_per_sec(statistic) / off.samples_per_sec(statistic))
        ratios[STEADY].append(on.wall_samples_per_sec / off.wall_samples_per_sec)
        identical &= results["off"].summary["final_loss"] == results["on"].summary["final_loss"]
        identical &= all(
            torch.equal(a, b)
            for a, b in zip(
                results["off"].model.parameters(), results["on"].model.parameters(), strict=True
            )
        )
    return {
        "off": statistics.median(throughput["off"]),
        "on": statistics.median(throughput["on"]),
        **{key: statistics.median(values) for key, values in ratios.items()},
        "identical": identical,
        "active": results["on"].summary["gears"]["prefetch_to_device"],
    }


def print_prefetch(r: dict, repeats: int) -> None:
    title = f"prefetch_to_device on host data (mlp, batch 128), medians of {repeats} interleaved repeats"
    table = Table(title=title)
    columns = ["off samples/s", "on samples/s", "ratio on/off (best step)"]
    columns += ["ratio (median step)", "ratio (steady state)", "acts here", "same result"]
    for column in columns:
        table.add_column(column, justify="right")
    table.add_row(
        f"{r['off']:,.1f}",
        f"{r['on']:,.1f}",
        f"{r['best step']:.3f}",
        f"{r['median step']:.3f}",
        f"{r[STEADY]:.3f}",
        "yes" if r["active"] else "no: passthrough",
        "yes" if r["identical"] else "NO",
    )
    Console(width=120).print(table)


def bench_generate(repeats: int, new_tokens: int = 256, device: str = "auto") -> dict:
    """tokens/s of greedy sampling with and without the KV cache, interleaved repeats."""
    target = resolve_device(device)
    torch.manual_seed(0)
    model = GPT(64, 512, n_layer=4, n_head=4, n_embd=128).to(target).eval()
    prompt = torch.randint(64, (1, 8), device=target)
    speeds: dict[bool, list[float]] = {True: [], False: []}
    outputs = {}
    for i in range(repeats + 1):  # the first round warms up, uncounted
        for cached in (True, False) if i % 2 else (False, True):
            if target.type == "cuda":
                torch.cuda.synchronize(target)
            start = time.perf_counter()
            outputs[cached] = generate(model, prompt, new_tokens, temperature=0, use_cache=cached)
            if target.type == "cuda":
                torch.cuda.synchronize(target)
            if i:
                speeds[cached].append(new_tokens / (time.perf_counter() - start))
    if not torch.equal(outputs[True], outputs[False]):
        raise SystemExit("error: the KV cache changed the greedy tokens")
    ratios = [a / b for a, b in zip(speeds[True], speeds[False], strict=True)]
    return {
        "device": str(target),
        "cached": statistics.median(speeds[True]),
        "plain": statistics.median(speeds[False]),
        "ratio": statistics.median(ratios),
        "range": (min(ratios), max(ratios)),
    }


def print_generate(r: dict, repeats: int) -> None:
    table = Table(title=f"generation, 256 new tokens, medians of {repeats} interleaved repeats")
    for column in ("device", "cached tokens/s", "no cache tokens/s", "ratio", "range"):
        table.add_column(column, justify="right")
    table.add_row(
        r["device"], f"{r['cached']:,.0f}", f"{r['plain']:,.0f}", f"{r['ratio']:.2f}x",
        f"{r['range'][0]:.2f}-{r['range'][1]:.2f}",
    )  # fmt: skip
    Console(width=140).print(table)


# --cases muon: the optimizers raced, each over its lr sweep (AdamW's lr; Muon's muon_lr)
OPTIMIZER_SWEEPS = {"adamw": [1e-3, 3e-3, 1e-2], "muon": [0.01, 0.02, 0.05]}
RACE_STEPS, RACE_VAL_EVERY = 150, 5


class BarReporter:
    """The run's validations, told through the loop's reporter seam (`trial.reporter`):
    it stops the run (as a pruner would) once the loss is below the bar `study` holds."""

    def __init__(self, storage: str, study: str, number: int | None) -> None:
        self.bar = float(study)

    def report(self, step: int, value: float | None) -> bool:
        return value is not None and value < self.bar


def race_run(folder: Path, bar: float, overrides: list[str]) -> dict:
    """One run to the bar: the step it got there (None: not within RACE_STEPS), its last loss."""
    common = [
        "logger=none", "progress_bar=false", "task=lm", "data=tokens", f"data.path={folder}",
        "data.block_size=32", "data.num_val_samples=32", "model=gpt", "model.n_layer=2",
        "model.n_embd=64", "batch_size=16", f"max_steps={RACE_STEPS}",
        f"val_every_n_steps={RACE_VAL_EVERY}", "optimizer.schedule=constant",
        "optimizer.weight_decay=0", "checkpoint.at_end=false",
        f"trial.reporter={__name__}.BarReporter", f"trial.study={bar!r}",
    ]  # fmt: skip
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[*common, *overrides])
    with tempfile.TemporaryDirectory() as run_dir:
        summary = fit(cfg, Path(run_dir)).summary
    reached = summary["stop_reason"] == "pruned"
    return {"steps": summary["steps"] if reached else None, "val_loss": summary["val_loss"]}


def bench_optimizers() -> dict:
    """Steps to the bigram-entropy bar for AdamW and Muon, each over its lr sweep."""
    text = grammar_text(1500)
    bar = bigram_entropy(text)
    coder = CharTokenizer.from_text(text)
    ids = coder.encode(text)
    split = len(ids) - len(ids) // 10
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as folder:
        write_token_folder(
            Path(folder), {"train": ids[:split], "val": ids[split:]}, coder.vocab_size, coder.meta()
        )

        def best(name: str) -> dict:  # the fewest steps; none there: the lowest loss
            return min(runs[name], key=lambda r: (r["steps"] or math.inf, r["val_loss"]))

        for lr in OPTIMIZER_SWEEPS["adamw"]:
            run = race_run(Path(folder), bar, ["optimizer=adamw", f"optimizer.lr={lr}"])
            runs.setdefault("adamw", []).append({"lr": lr, **run})
            logging.info("adamw lr %g: %s", lr, run)
        adamw_lr = best("adamw")["lr"]
        for lr in OPTIMIZER_SWEEPS["muon"]:
            muon = ["optimizer=muon", f"optimizer.muon_lr={lr}", f"optimizer.lr={adamw_lr}"]
            run = race_run(Path(folder), bar, muon)
            runs.setdefault("muon", []).append({"lr": lr, **run})
            logging.info("muon muon_lr %g: %s", lr, run)
        return {"bar": bar, "runs": runs, "best": {name: best(name) for name in runs}}


def print_optimizers(r: dict) -> None:
    title = (
        f"steps to the bigram-entropy bar ({r['bar']:.3f} nats/char) on the grammar, "
        f"validated every {RACE_VAL_EVERY} steps, at most {RACE_STEPS}; one run per lr"
    )
    table = Table(title=title)
    for column in ("optimizer", "lr", "steps to bar", "last val loss", "best"):
        table.add_column(column, justify="right")
    for name, runs in r["runs"].items():
        for run in runs:
            table.add_row(
                name, f"{run['lr']:g}", str(run["steps"] or f"> {RACE_STEPS}"),
                f"{run['val_loss']:.3f}", "*" if run is r["best"][name] else "",
            )  # fmt: skip
    Console(width=140).print(table)
    adamw, muon = r["best"]["adamw"]["steps"], r["best"]["muon"]["steps"]
    if adamw and muon:
        print(f"Muon reaches the bar in {muon / adamw:.2f}x AdamW's steps ({muon} vs {adamw})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument(
        "--cases",
        default="mlp,resnet18,gpt,gpt-amp",
        help="comma-separated: " + ",".join([*CASES, "muon"]),
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="measured steps (default: per case)"
    )
    parser.add_argument(
        "--prefetch-repeats", type=int, default=5, help="0 skips the prefetch comparison"
    )
    parser.add_argument(
        "--generate-repeats", type=int, default=5, help="0 skips the generation comparison"
    )
    parser.add_argument(
        "--checkpoint-repeats", type=int, default=5, help="0 skips the checkpoint comparison"
    )
    parser.add_argument("overrides", nargs="*", help="config overrides for both loops")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("gearshift").setLevel(logging.WARNING)

    cases = args.cases.split(",")
    if "muon" in cases:
        print_optimizers(bench_optimizers())
        cases.remove("muon")
    rows = []
    for name in cases:
        overrides, steps = CASES[name]
        rows.append(
            bench_case(name, [*overrides, *args.overrides], args.steps or steps, args.repeats)
        )

    table = Table(
        title=f"template / hand-written loop, medians of {args.repeats} interleaved repeats"
    )
    columns = ["case", "amp", "template samples/s", "hand samples/s", "template tokens/s"]
    columns += ["ratio (steady state)", "range"]
    columns += ["ratio (best step)", "ratio (median step)"]
    for column in columns:
        table.add_column(column, justify="right")
    for r in rows:  # none when --cases named muon alone
        tokens = r["tokens_per_sample"]
        table.add_row(
            r["case"],
            r["amp"],
            f"{r['template']:,.1f}",
            f"{r['hand']:,.1f}",
            f"{r['template'] * tokens:,.0f}" if tokens else "-",
            f"{r[STEADY]:.3f}",
            f"{r['range'][0]:.3f}-{r['range'][1]:.3f}",
            f"{r['best step']:.3f}",
            f"{r['median step']:.3f}",
        )
    if rows:
        Console(width=140).print(table)
    if args.prefetch_repeats > 0:
        result = bench_prefetch(args.overrides, args.steps or 60, args.prefetch_repeats)
        print_prefetch(result, args.prefetch_repeats)
    if args.generate_repeats > 0:
        print_generate(bench_generate(args.generate_repeats), args.generate_repeats)
    if args.checkpoint_repeats > 0:  # scripts/bench_checkpoint.py: sync vs async saves
        result = bench_checkpoint(args.checkpoint_repeats)
        print_checkpoint(result, args.checkpoint_repeats)


if __name__ == "__main__":
    main()
