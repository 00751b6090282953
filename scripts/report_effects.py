"""What a gear bought, told from noise and from a gear that did not act (scripts/report.py).

Each gear run is paired with the baseline run of its round, so a machine that drifts over
minutes moves both runs of a pair alike. A configuration's effect is the median of its
pairs' ratios (gear / baseline) with an interval around it; an interval that contains 1.0
is within noise. A pair whose resolved gears (summary.json `gears`) equal the baseline's
on the device it ran on measured nothing the gear does: the gear did not act there.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from functools import cache
from statistics import NormalDist

BASELINE = "baseline"
FASTER = "faster"
SLOWER = "slower"
NOISE = "within noise"
DID_NOT_ACT = "did not act"

MIN_PAIRS = 3  # fewer pairs' min-max covers the median half the time or less: no verdict
RESOLVE = 0.05  # the effect the "rounds to resolve" estimate is about: 5%
POWER = 0.8  # ... resolved in about 4 sweeps out of 5

# Gears that act on some devices only. summary.json reports the switch as set, so that
# the run on another device is told from it here: cuDNN is CUDA's, and pinned memory and
# asynchronous copies are about a copy from the host to an accelerator.
ACTS_ON = {
    "cudnn_benchmark": ({"cuda"}, "cuDNN's autotuner acts on CUDA only"),
    "pin_memory": ({"cuda", "xpu", "mps"}, "page-locked memory speeds host-to-device copies only"),
    "non_blocking": ({"cuda", "xpu", "mps"}, "no host-to-device copy to overlap"),
}


def device_type(summary: dict) -> str:
    return str(summary.get("device", "cpu")).split(":")[0]


def acting_settings(gears: dict, base: dict, device: str) -> dict[str, tuple]:
    """{key: (baseline's value, this run's)} for the resolved gears that differ from the
    baseline's and act on `device` (the `*_reason` keys say why, they are no setting)."""
    changed = {}
    for key in sorted(gears.keys() | base.keys()):
        if key.endswith("_reason") or gears.get(key) == base.get(key):
            continue
        devices, _ = ACTS_ON.get(key, (None, ""))
        if devices is not None and device not in devices:
            continue
        changed[key] = (base.get(key), gears.get(key))
    return changed


def why_not_acting(gears: dict, base: dict, device: str) -> list[str]:
    """Why a run whose resolved gears equal the baseline's did not act: the reasons it
    resolved with (amp=on measured float32 faster, num_workers=auto found no free core)
    and the switches that do nothing on this device."""
    reasons = []
    for key in sorted(gears):
        if key.endswith("_reason") and gears[key] != base.get(key):
            setting = key.removesuffix("_reason")
            reasons.append(f"{setting} resolved to {shown(gears.get(setting))} ({gears[key]})")
    for key, (devices, why) in ACTS_ON.items():
        if gears.get(key) != base.get(key) and device not in devices:
            reasons.append(f"{key}={shown(gears.get(key))}: {why} (ran on {device})")
    return reasons


def shown(value: object) -> str:
    """A resolved gear as the config spells it: channels_last, true, null."""
    return value if isinstance(value, str) else json.dumps(value)


@cache
def interval_rank(n: int) -> int:
    """k of the interval [k-th smallest, k-th largest] of n ratios that covers their true
    median with >= 90% probability (a sign-test interval: no assumption about the noise's
    shape); 1 (min-max) below 5 pairs, where no interval reaches 90%."""
    k, term, below = 1, 1, 1  # term: comb(n, k - 1); below: the sum of comb(n, i), i < k
    while k + 1 <= n // 2:
        term = term * (n - k + 1) // k  # comb(n, k)
        below += term  # now the tail of the interval one step narrower
        if 1 - 2 * below / 2**n < 0.90:
            break
        k += 1
    return k


def coverage(n: int, k: int) -> float:
    """P(the k-th smallest to the k-th largest of n samples holds their median)."""
    outside = sum(math.comb(n, i) for i in range(k)) / 2**n
    return 1 - 2 * outside


def describe_interval(n: int) -> str:
    k = interval_rank(n)
    nth = f"{k}{'nd' if k == 2 else 'rd' if k == 3 else 'th'}"
    which = "min-max" if k == 1 else f"{nth} smallest to {nth} largest"
    return f"{which} of {n} pairs ({coverage(n, k):.0%} interval)"


@dataclass(frozen=True)
class Ratio:
    """The median of paired ratios and its interval."""

    median: float
    lo: float
    hi: float
    n: int

    @property
    def within_noise(self) -> bool:
        return self.n < MIN_PAIRS or self.lo <= 1.0 <= self.hi

    @classmethod
    def of(cls, ratios: list[float]) -> Ratio | None:
        ratios = sorted(r for r in ratios if r is not None and math.isfinite(r) and r > 0)
        if not ratios:
            return None
        k = interval_rank(len(ratios))
        return cls(statistics.median(ratios), ratios[k - 1], ratios[-k], len(ratios))


@cache
def expected_half_width(n: int) -> float:
    """The interval's expected half-width, in standard deviations of the log ratios (Blom's
    approximation of normal order statistics)."""
    k = interval_rank(n)
    z = NormalDist().inv_cdf
    return (z((n - k + 1 - 0.375) / (n + 0.25)) - z((k - 0.375) / (n + 0.25))) / 2


def rounds_to_resolve(log_ratios: list[float], effect: float = RESOLVE, limit: int = 999) -> int:
    """About how many rounds an effect of `effect` needs at the spread of these pairs so that
    its interval clears 1.0 in 4 sweeps out of 5; `limit` + 1 when more than `limit`."""
    if len(log_ratios) < 2:
        return limit + 1  # one pair shows no spread: nothing to go by
    spread = statistics.stdev(log_ratios)
    target = math.log1p(effect)
    median_se = math.sqrt(math.pi / 2) * spread  # the median's standard error times sqrt(n)
    for n in range(MIN_PAIRS, limit + 1):
        if (
            spread * expected_half_width(n) + NormalDist().inv_cdf(POWER) * median_se / math.sqrt(n)
            <= target
        ):
            return n
    return limit + 1


def ratio(gear: dict, base: dict, key: str) -> float | None:
    a, b = gear.get(key), base.get(key)
    return a / b if a is not None and b else None


@dataclass
class Effect:
    """One configuration against the baseline: its class, its ratios and why."""

    name: str
    klass: str
    pairs: int  # the pairs its figures come from
    samples_per_sec: float  # the median of those runs
    throughput: Ratio | None = None  # gear / baseline samples per second
    step_time: Ratio | None = None  # gear / baseline median step time
    memory: Ratio | None = None  # gear / baseline peak memory
    data_wait_pct: float | None = None
    final_loss: float | None = None
    acted: dict[str, tuple] = field(default_factory=dict)  # what differed from the baseline
    reasons: list[str] = field(default_factory=list)  # why it did not act (in some rounds)
    idle_pairs: int = 0  # pairs in which it did not act
    varied_pairs: int = 0  # acting pairs whose gears resolved otherwise than `acted`
    unpaired: int = 0  # runs whose round has no finished baseline run
    rounds_needed: int | None = None  # within noise: rounds that would resolve 5%
    same_as: str | None = None  # another configuration with the same resolved settings

    @property
    def settings(self) -> frozenset:
        """What acted, as comparable items: (key, value) pairs."""
        return frozenset((k, json.dumps(v[1], sort_keys=True)) for k, v in self.acted.items())


def measure(name: str, pairs: list[tuple[dict, dict]], unpaired: int = 0) -> Effect:
    """A configuration's effect from its (gear summary, baseline summary) pairs."""
    acting, idle, reasons = [], [], []
    acted: dict[str, tuple] = {}
    varied = 0
    for gear, base in pairs:
        if "gears" not in gear or "gears" not in base:  # older summaries: measured as acting
            acting.append((gear, base))
            continue
        device = device_type(gear)
        changed = acting_settings(gear["gears"], base["gears"], device)
        if changed:
            acting.append((gear, base))
            acted = acted or changed
            varied += changed != acted  # amp=on resolved to bf16 in one round, float32 in another
        else:
            idle.append((gear, base))
            reasons += [
                r for r in why_not_acting(gear["gears"], base["gears"], device) if r not in reasons
            ]
    used = acting or idle  # a gear that never acted: its pairs measure the noise
    throughput = Ratio.of([ratio(g, b, "samples_per_sec") for g, b in used])
    effect = Effect(
        name=name,
        klass=NOISE,
        pairs=len(used),
        samples_per_sec=median_of(used, "samples_per_sec"),
        throughput=throughput,
        step_time=Ratio.of([ratio(g, b, "step_time_ms") for g, b in used]),
        memory=Ratio.of([ratio(g, b, "peak_memory_bytes") for g, b in used]),
        data_wait_pct=median_of(used, "data_wait_pct"),
        final_loss=median_of(used, "final_loss"),
        acted=acted,
        reasons=reasons,
        idle_pairs=len(idle) if acting else 0,
        varied_pairs=varied,
        unpaired=unpaired,
    )
    if not acting and idle:
        effect.klass = DID_NOT_ACT
    elif throughput is not None and not throughput.within_noise:
        effect.klass = FASTER if throughput.median > 1 else SLOWER
    else:
        logs = [
            math.log(ratio(g, b, "samples_per_sec"))
            for g, b in used
            if ratio(g, b, "samples_per_sec")
        ]
        effect.rounds_needed = rounds_to_resolve(logs)
    return effect


def median_of(pairs: list[tuple[dict, dict]], key: str) -> float | None:
    values = [g[key] for g, _ in pairs if g.get(key) is not None]
    return statistics.median(values) if values else None


def baseline_effect(name: str, runs: list[dict]) -> Effect:
    """The baseline's row: its own figures, 1.0 by definition, and how far its rounds
    disagree (max / min of its throughputs) as the noise one run alone carries."""
    pairs = [(s, s) for s in runs]
    effect = Effect(
        name=name,
        klass=BASELINE,
        pairs=len(runs),
        samples_per_sec=median_of(pairs, "samples_per_sec"),
        data_wait_pct=median_of(pairs, "data_wait_pct"),
        final_loss=median_of(pairs, "final_loss"),
    )
    one = Ratio(1.0, 1.0, 1.0, len(runs))
    effect.throughput = effect.step_time = effect.memory = one
    return effect


def run_spread(runs: list[dict]) -> float | None:
    """1 - slowest / fastest of the runs' throughputs."""
    values = [s["samples_per_sec"] for s in runs if s.get("samples_per_sec")]
    return 1 - min(values) / max(values) if len(values) > 1 else None


ORDER = {FASTER: 0, BASELINE: 1, SLOWER: 2, NOISE: 3, DID_NOT_ACT: 4}


def ranking(effects: list[Effect]) -> list[Effect]:
    """Real effects first (faster, the baseline, slower, each by throughput), then what is
    within noise, then what did not act: noise never ranks above a measured effect."""

    def rank(e: Effect) -> tuple[int, float]:
        if e.klass == DID_NOT_ACT or e.throughput is None:
            return ORDER[e.klass], 0.0  # not ranked: left in the sweep's order
        return ORDER[e.klass], -e.throughput.median

    return sorted(effects, key=rank)


def mark_same_settings(effects: list[Effect]) -> None:
    """amp_channels_last where amp resolved to float32 is channels_last again: say so, on
    the one of them with fewer pairs (else the longer name)."""
    seen: dict[frozenset, str] = {}
    for effect in sorted(effects, key=lambda e: (-e.pairs, len(e.name))):
        if effect.klass in (BASELINE, DID_NOT_ACT) or not effect.acted:
            continue
        if effect.settings in seen:
            effect.same_as = seen[effect.settings]
        else:
            seen[effect.settings] = effect.name


@dataclass
class Combination:
    """A configuration that switches several measured gears at once (gear=all), beside the
    product of its parts' effects that are not noise: outside its interval, they interfere."""

    name: str
    measured: Ratio
    parts: list[Effect]  # its gears measured alone
    uncovered: list[str]  # what acted in it that no configuration measured alone

    @property
    def counted(self) -> list[Effect]:
        return [p for p in self.parts if p.klass in (FASTER, SLOWER)]

    @property
    def product(self) -> float:
        return math.prod(p.throughput.median for p in self.counted)

    @property
    def reading(self) -> str:
        if self.measured.n < MIN_PAIRS:
            return "too few pairs to compare"
        if self.product < self.measured.lo:
            return "more than the product of its parts: they compound"
        if self.product > self.measured.hi:
            return "less than the product of its parts: they interfere"
        return "as the product of its parts (within its interval)"


def combinations(effects: list[Effect]) -> list[Combination]:
    """Each configuration whose acting settings hold those of two or more single gears."""
    measured = [e for e in effects if e.klass not in (BASELINE, DID_NOT_ACT) and e.acted]
    # a single gear: no other configuration's settings lie strictly inside its own (of two
    # with the same settings, the one mark_same_settings left unmarked)
    singles = [
        e for e in measured if not e.same_as and not any(o.settings < e.settings for o in measured)
    ]
    found = []
    for effect in measured:
        parts = [s for s in singles if s.settings < effect.settings]
        if len(parts) < 2 or effect.throughput is None:
            continue
        covered = frozenset().union(*(p.settings for p in parts))
        uncovered = sorted(k for k, _ in effect.settings - covered)
        found.append(Combination(effect.name, effect.throughput, parts, uncovered))
    return found
