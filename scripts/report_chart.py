"""report.png: each configuration's ratios to the baseline with their intervals (scripts/report.py).

Three panels (throughput, median step time, peak memory), a line at 1.0 in each; an effect
is coloured (green: better, red: worse), what is within noise is grey, and the
configurations that did not act are drawn apart, below, as the noise of two runs of the
same settings. A combination (gear=all) shows the product of its parts' effects beside it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from report_effects import BASELINE, Effect, Ratio

GOOD, BAD, NOISE_GREY, IDLE_GREY = "tab:green", "tab:red", "0.55", "0.75"
# (attribute, title, whether a ratio above 1 is better)
PANELS = (
    ("throughput", "throughput / baseline (> 1: faster)", True),
    ("step_time", "median step time / baseline (< 1: faster)", False),
    ("memory", "peak memory / baseline (< 1: less)", False),
)


def colour(r: Ratio, higher_is_better: bool, baseline: bool) -> str:
    if baseline:
        return "black"
    if r.within_noise:
        return NOISE_GREY
    return GOOD if (r.median > 1) == higher_is_better else BAD


def draw(ax, effects: list[Effect], attribute: str, better_up: bool, idle: bool) -> None:
    ax.axvline(1.0, color="0.3", linestyle="--", linewidth=1, zorder=0)
    for y, e in enumerate(effects):
        r: Ratio | None = getattr(e, attribute)
        if r is None:
            continue
        c = IDLE_GREY if idle else colour(r, better_up, e.klass == BASELINE)
        ax.errorbar(
            r.median,
            y,
            xerr=[[r.median - r.lo], [r.hi - r.median]],
            fmt="o",
            color=c,
            mfc="white" if idle else c,
            capsize=4,
            markersize=6,
        )
        ax.annotate(f" {r.median:.2f}x", (r.hi, y), va="center", fontsize=8, color=c)
    ax.set_yticks(range(len(effects)), [e.name for e in effects])
    ax.set_ylim(len(effects) - 0.5, -0.5)  # the first ranked at the top
    ax.margins(x=0.12)
    ax.grid(axis="x", alpha=0.3)


def plot(reading, path: Path, title: str) -> None:
    ranked, idle = reading.ranked, reading.idle
    rows = [ranked, idle] if idle else [ranked]
    heights = [max(len(r), 1) + 1 for r in rows]
    footnotes = [
        f"{e.name}: " + "; ".join(e.reasons or ["the same resolved gears as the baseline"])
        for e in idle
    ]
    wrapped = [line for f in footnotes for line in textwrap.wrap(f, 170)]
    fig, axes = plt.subplots(
        len(rows),
        3,
        figsize=(17, 1.6 + 0.42 * sum(heights) + 0.16 * len(wrapped)),
        gridspec_kw={"height_ratios": heights},
        sharex="col",
        squeeze=False,
    )
    for row, effects in enumerate(rows):
        for col, (attribute, label, better_up) in enumerate(PANELS):
            ax = axes[row][col]
            draw(ax, effects, attribute, better_up, idle=row == 1)
            if col:
                ax.tick_params(labelleft=False)
            if row == 0:
                ax.set_title(label, fontsize=10)
    for combo in (c for c in reading.combos if c.counted):  # else the product is the 1.0 line
        y = [e.name for e in ranked].index(combo.name)
        axes[0][0].plot(combo.product, y, "D", color="tab:purple", markersize=7, zorder=3)
    if idle:
        axes[1][0].set_title(
            "did not act here (resolved to the baseline's settings): two runs of the same "
            "settings, the noise itself",
            fontsize=10,
            loc="left",
        )
    legend = [
        Line2D([], [], marker="o", color=GOOD, label="effect: better"),
        Line2D([], [], marker="o", color=BAD, label="effect: worse"),
        Line2D([], [], marker="o", color=NOISE_GREY, label="within noise (interval holds 1.0)"),
    ]
    if any(c.counted for c in reading.combos):
        legend.append(
            Line2D([], [], marker="D", color="tab:purple", linestyle="", label="product of parts")
        )
    if idle:
        legend.append(Line2D([], [], marker="o", color=IDLE_GREY, mfc="white", label="did not act"))
    fig.legend(handles=legend, loc="upper right", ncol=len(legend), fontsize=8, frameon=False)
    fig.suptitle(title, x=0.01, ha="left", fontsize=11)
    bottom = 0.02 + 0.16 * len(wrapped) / fig.get_figheight()
    if wrapped:
        fig.text(0.01, 0.01, "\n".join(wrapped), fontsize=7, color="0.35", va="bottom")
    fig.tight_layout(rect=(0, bottom, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)
