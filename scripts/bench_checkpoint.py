"""How long does a checkpoint stop the training loop? Sync against `checkpoint.async_save`.

A GPT of 8 layers x 512 (about 30M parameters: 118 MB of float32 weights, 354 MB with
AdamW's two moments) trains a few steps between saves through the Checkpointer the
training loop uses (state/checkpointer.py, DCP step folders). Saves alternate between a sync and
an async Checkpointer (sync, async, async, sync, ...) so drift in machine speed hits both
alike. Per save:

- stall: how long `save()` keeps the loop (sync: the whole write; async: the copy of the
  state to host memory, then the loop goes on);
- write: from the save to the folder renamed into place (async: in the background, while
  the loop trains on; the next save would wait for it);
- step ms after the save: the median of the steps that follow it (async: they share the
  CPU with the background write);
- peak host memory: the process's RSS high-water mark over the save and its write, above
  the RSS just before it (Linux: VmHWM, reset through /proc/self/clear_refs). Besides,
  async holds its staging copy of the model and optimizer state for the whole run (made at
  its first save, reused by the next ones): the title gives its size.

    python scripts/bench_checkpoint.py               # 5 interleaved repeats
    python scripts/bench.py --checkpoint-repeats 5   # the same, as a table of make bench
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from gearshift.config.schema import CheckpointConfig
from gearshift.engine.optim import Optimizers
from gearshift.models.gpt import GPT
from gearshift.parallel.distributed import Ranks
from gearshift.state.checkpointer import Checkpointer, Layout, ModelState
from gearshift.state.position import Position


def rss_bytes(field: str) -> int:
    """VmRSS or VmHWM of this process, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


def bench_checkpoint(repeats: int, steps: int = 3, n_layer: int = 8, n_embd: int = 512) -> dict:
    torch.manual_seed(0)
    model = GPT(8192, 128, n_layer=n_layer, n_head=8, n_embd=n_embd)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(8192, (2, 65))

    def step() -> float:
        start = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    step()  # the moments exist: the checkpoint has its full size
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    state_bytes = weights + sum(
        t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
    )
    position = Position(global_batch=2)
    results: dict[bool, dict[str, list[float]]] = {
        mode: {"stall": [], "write": [], "steps": [], "peak": []} for mode in (False, True)
    }
    with tempfile.TemporaryDirectory(prefix="bench_checkpoint_", dir=".") as tmp:
        checkpointers = {}
        for mode in (False, True):
            cfg = CheckpointConfig(keep=1, async_save=mode)
            folder = Path(tmp) / ("async" if mode else "sync") / "checkpoints"
            checkpointer = Checkpointer(folder, Ranks(), {}, {}, cfg, Layout(1, "none", 2))
            checkpointer.register("position", position)
            checkpointer.register("model", ModelState(model))
            checkpointer.register("optimizer", Optimizers(model, [optimizer]))
            checkpointers[mode] = checkpointer
        for i in range(repeats + 1):  # the first round warms up, uncounted
            for mode in (False, True) if i % 2 else (True, False):
                checkpointer = checkpointers[mode]
                position.step += 1
                before = rss_bytes("VmRSS")
                reset_peak_rss()
                start = time.perf_counter()
                checkpointer.save(position, check=lambda: None)
                stall = time.perf_counter() - start
                written = [time.perf_counter()]  # sync: written when save() returns
                if checkpointer.writes is not None:  # async: written when its future is done
                    written = []
                    checkpointer.writes.pending[1].add_done_callback(
                        lambda _, written=written: written.append(time.perf_counter())
                    )
                times = [step() for _ in range(steps)]
                checkpointer.wait()
                write = written[0] - start
                peak = rss_bytes("VmHWM") - before
                if i:
                    for key, value in zip(results[mode], (stall, write, statistics.median(times), peak), strict=True):  # fmt: skip
                        results[mode][key].append(value)
        size = sum(f.stat().st_size for f in checkpointers[True].latest().iterdir())
        for checkpointer in checkpointers.values():
            checkpointer.close()
    median = {mode: {k: statistics.median(v) for k, v in r.items()} for mode, r in results.items()}
    ratios = [a / s for a, s in zip(results[True]["stall"], results[False]["stall"], strict=True)]
    return {
        "weights_mb": weights / 1e6,
        "staging_mb": state_bytes / 1e6,
        "checkpoint_mb": size / 1e6,
        "sync": median[False],
        "async": median[True],
        "peak_max": {mode: max(results[mode]["peak"]) for mode in (False, True)},
        "ratio": statistics.median(ratios),
        "range": (min(ratios), max(ratios)),
    }


def print_checkpoint(r: dict, repeats: int) -> None:
    title = (
        f"checkpoint stall, GPT 8x512 ({r['weights_mb']:.0f} MB weights, {r['checkpoint_mb']:.0f} MB "
        f"checkpoint), medians of {repeats} interleaved saves; async/sync stall "
        f"{r['ratio']:.3f} (range {r['range'][0]:.3f}-{r['range'][1]:.3f}; goal <= 0.25); "
        f"async holds a {r['staging_mb']:.0f} MB staging copy for the run"
    )
    table = Table(title=title)
    columns = ["save", "loop stall ms", "write ms", "step ms after the save", "peak extra RSS MB (median / max)"]  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for name in ("sync", "async"):
        m = r[name]
        table.add_row(
            name, f"{m['stall'] * 1e3:,.0f}", f"{m['write'] * 1e3:,.0f}", f"{m['steps'] * 1e3:,.0f}",
            f"{m['peak'] / 1e6:,.0f} / {r['peak_max'][name == 'async'] / 1e6:,.0f}",
        )  # fmt: skip
    Console(width=140).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print_checkpoint(bench_checkpoint(args.repeats), args.repeats)


if __name__ == "__main__":
    main()
