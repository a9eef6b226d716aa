"""The arithmetic and the page of `tools.bench.cache`: each arm's samples by round, their medians and
p95s, the comparisons (added ms at the median and the p95, ratio of medians, the median of the per-round
paired differences with a bootstrap 95 % interval) and the Markdown tables."""

from __future__ import annotations

import argparse
import os
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from tools.bench.cache_client import Answer
from tools.bench.common import pct

MISSES = ("off", "off_b", "exact", "semantic")
HITS = ("exact_hit", "semantic_hit")
MEASURES = ("first_byte", "first_token", "total")
LABELS = {"first_byte": "first byte", "first_token": "first token", "total": "whole answer"}


@dataclass
class Arm:
    """One arm: which team sends what, the `x-llmfleet-cache` it must answer with, and its samples."""

    name: str
    team: str
    expect: str  # "" (cache not asked), "miss" or "hit"
    stores: bool  # a miss whose answer the gateway stores (the window waits for the entry)
    what: str  # one line for the page
    times: dict[str, dict[int, float]] = field(default_factory=lambda: {m: {} for m in MEASURES})
    gateway_cpu: list[float] = field(default_factory=list)
    platform_cpu: list[float] = field(default_factory=list)
    unexpected: int = 0  # an answer with another status or cache header than expected: left out
    not_stored: int = 0  # a miss whose entry did not appear (the next hit of that round then misses)

    def add(self, round_: int, answer: Answer, gateway_s: float, platform_s: float) -> bool:
        if answer.status != 200 or answer.cache != self.expect or answer.first_token_s is None:
            self.unexpected += 1
            return False
        self.times["first_byte"][round_] = answer.first_byte_s
        self.times["first_token"][round_] = answer.first_token_s
        self.times["total"][round_] = answer.total_s
        self.gateway_cpu.append(gateway_s)
        self.platform_cpu.append(platform_s)
        return True

    @property
    def n(self) -> int:
        return len(self.times["total"])

    def values(self, measure: str) -> list[float]:
        return list(self.times[measure].values())


def median_ms(values: Sequence[float]) -> float:
    return statistics.median(values) * 1000 if values else float("nan")


def p95_ms(values: Sequence[float]) -> float:
    return pct(values, 0.95) * 1000 if values else float("nan")


def paired(arm: Arm, ref: Arm, measure: str) -> list[float]:
    """Per round where both have a sample: arm - reference, seconds."""
    a, b = arm.times[measure], ref.times[measure]
    return [a[r] - b[r] for r in sorted(a.keys() & b.keys())]


def bootstrap_ci(values: Sequence[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """The 95 % percentile-bootstrap interval of the median of `values` (seeded: the page is reproducible)."""
    if not values:
        return float("nan"), float("nan")
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


@dataclass(frozen=True)
class Comparison:
    added_median_ms: float
    added_p95_ms: float
    ratio_median: float
    paired_median_ms: float
    paired_ci_ms: tuple[float, float]
    pairs: int


def compare(arm: Arm, ref: Arm, measure: str) -> Comparison:
    mine, theirs = arm.values(measure), ref.values(measure)
    diffs = paired(arm, ref, measure)
    low, high = bootstrap_ci(diffs)
    ref_median = median_ms(theirs)
    return Comparison(
        added_median_ms=median_ms(mine) - ref_median,
        added_p95_ms=p95_ms(mine) - p95_ms(theirs),
        ratio_median=median_ms(mine) / ref_median if ref_median else float("nan"),
        paired_median_ms=median_ms(diffs),
        paired_ci_ms=(low * 1000, high * 1000),
        pairs=len(diffs),
    )


def cpu_ms(values: Sequence[float]) -> str:
    """Mean CPU ms per request (a sum over the windows: the mean is what adds up)."""
    return f"{statistics.fmean(values) * 1000:.2f}" if values else "n/a"


def _mp(values: Sequence[float]) -> str:
    return f"{median_ms(values):.2f} / {p95_ms(values):.2f}"


def hit_table(arms: dict[str, Arm], pairs: Sequence[tuple[str, str]]) -> list[str]:
    """Hit vs the same request's miss (served by the engine), per measure: median / p95 and the ratio."""
    head = "| request | n (miss / hit) | " + " | ".join(
        f"{LABELS[m]} ms, miss: median / p95 | hit: median / p95 | hit / miss (median)" for m in MEASURES
    )
    lines = [head + " |", "|---|---|" + "---|---|---|" * len(MEASURES)]
    for miss_name, hit_name in pairs:
        miss, hit = arms[miss_name], arms[hit_name]
        cells = [f"`{hit_name}` vs `{miss_name}`", f"{miss.n} / {hit.n}"]
        for m in MEASURES:
            ratio = compare(hit, miss, m).ratio_median
            cells += [_mp(miss.values(m)), _mp(hit.values(m)), f"**{ratio:.3f}**"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def lookup_table(arms: dict[str, Arm], names: Sequence[str], ref: str, measure: str) -> list[str]:
    """Each miss arm vs the cache-off reference on one measure: absolute, added, ratio, paired."""
    base = arms[ref]
    lines = [
        f"| arm | n | {LABELS[measure]} ms: median / p95 | added ms: median / p95 | ratio of medians | "
        "paired difference ms: median [95 % CI] |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        arm = arms[name]
        if name == ref:
            cells = ["reference", "1", "-"]
        else:
            c = compare(arm, base, measure)
            cells = [
                f"**{c.added_median_ms:+.2f}** / {c.added_p95_ms:+.2f}",
                f"{c.ratio_median:.3f}",
                f"{c.paired_median_ms:+.2f} [{c.paired_ci_ms[0]:+.2f}, {c.paired_ci_ms[1]:+.2f}] ({c.pairs} pairs)",
            ]
        lines.append(f"| `{name}` | {arm.n} | {_mp(arm.values(measure))} | " + " | ".join(cells) + " |")
    return lines


def cpu_table(arms: dict[str, Arm], names: Sequence[str]) -> list[str]:
    lines = [
        "| arm | n | gateway CPU ms / request | platform CPU ms / request (gateway + orchestrator + agents) "
        "| unexpected answers | entries not stored |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        arm = arms[name]
        lines.append(
            f"| `{name}` | {arm.n} | {cpu_ms(arm.gateway_cpu)} | {cpu_ms(arm.platform_cpu)} | "
            f"{arm.unexpected} | {arm.not_stored} |"
        )
    return lines


def method(args: argparse.Namespace, wall_s: float, precise_cpu: bool) -> list[str]:
    clock = (
        "the kernel's run time of each thread (`/proc/<pid>/task/<tid>/schedstat`, ns)"
        if precise_cpu
        else "psutil user+system (10 ms ticks: read the CPU columns as a rough mean)"
    )
    return [
        f"- {args.requests} counted rounds after {args.warmup} warm-up rounds, {wall_s:.0f} s: each round one new "
        "request from each cache-miss arm (`off`, `off_b`, `exact`, `semantic`), then the two hits "
        "(`exact_hit`, `semantic_hit`), each group in a fresh seeded random order; one request at a time.",
        f"- The request: a system prompt and a question of 12 words no other round shares, `temperature` 0, "
        f"`max_tokens` {args.max_tokens} with `ignore_eos`, `stream: true`; the same body from every miss "
        "arm in a round (each team has its own entries: every one is a miss served by the engine).",
        f"- enginesim 8B profile at `--speed {args.speed}` (one node) and bge-m3 (one node) behind one "
        "gateway, one orchestrator and their agents; semantic threshold "
        f"{args.threshold} (the reworded question's cosine is about 0.94).",
        f"- {args.gap_ms:.0f} ms of idle time after each request (and after its entry was stored): its tail "
        "(the settle, logs) ends before the next one starts, and every request finds the engines idle for "
        "more than 50 ms (enginesim counts a shorter idle time as simulated time still owed, so a request "
        "arriving sooner gets its first steps early: the engine's time would depend on the order).",
        "- Times: the client's, from the request's write: first byte of the response, first content token, "
        "last byte. Added = arm - `off` at the same percentile; ratio = arm median / `off` median; paired = "
        "median over rounds of (arm - `off`) for the same question, with a 95 % bootstrap interval. `off_b` "
        "is a second cache-off team: its row is what no difference looks like on this machine.",
        f"- CPU per request: {clock}, summed over the request's window (the request, the entry's store for a "
        "caching miss, the idle time after it), as a mean per request.",
        "- The client, the platform, PostgreSQL and Redis share the machine's cores.",
    ]


@dataclass
class Run:
    """One run: the arms, every server's metrics over the counted rounds ("gateway", then by model),
    the counted rounds' wall time, the CPU clock used, and the gateway's CPU over the counted rounds
    (the kernel's run time, psutil's ticks) to check the windows against."""

    arms: dict[str, Arm]
    metrics: dict[str, dict[str, float]]
    wall_s: float
    precise_cpu: bool
    gateway_cpu_s: tuple[float, float]


def mean_of(metrics: dict[str, float], family: str, what: str, label: str = "") -> str:
    """`family`'s mean in ms over its observations in the counted rounds (those with `label`), as text."""
    tail = f"|{label}" if label else ""
    count, total = metrics.get(f"{family}_count{tail}", 0.0), metrics.get(f"{family}_sum{tail}", 0.0)
    return f"{what} mean {total / count * 1000:.2f} ms over {int(count)}" if count else f"{what}: none"


def counters(run: Run) -> list[str]:
    gateway = run.metrics.get("gateway", {})
    lookup = "llmfleet_gateway_cache_lookup_seconds"
    results = ", ".join(
        f"{k.split('|', 1)[1]} {int(v)}"
        for k, v in sorted(gateway.items())
        if k.startswith("llmfleet_gateway_cache_requests_total|")
    )
    kernel, ticks = run.gateway_cpu_s
    windows = sum(sum(arm.gateway_cpu) for arm in run.arms.values())
    engines = [
        f"- {model}'s own figures: "
        + "; ".join(
            mean_of(metrics, f"vllm:{family}_seconds", family.replace("_", " "))
            for family in ("time_to_first_token", "e2e_request_latency")
        )
        for model, metrics in run.metrics.items()
        if model != "gateway"
    ]
    return [
        f"- `{lookup}` (hits' lookups included): "
        f"{mean_of(gateway, lookup, 'exact', 'exact')}; {mean_of(gateway, lookup, 'semantic', 'semantic')}",
        f"- `llmfleet_gateway_cache_requests_total` by result: {results or 'none'}",
        *engines,
        f"- The gateway's CPU over the counted rounds: {kernel:.2f} s by the clock above, {ticks:.2f} s by "
        f"psutil; {windows:.2f} s of it inside the requests' windows.",
    ]


def render(args: argparse.Namespace, about: dict[str, str], run: Run) -> str:
    arms = run.arms
    return "\n".join(
        [
            "# Response cache benchmark",
            "",
            "Generated by `python -m tools.bench cache`: a hit vs the same request's miss, and a miss with the",
            "cache off / exact / semantic for the team, interleaved request by request on one platform.",
            "",
            "## Machine",
            "",
            *[f"- {k}: {v}" for k, v in about.items()],
            f"- load_avg_1m at the end: {os.getloadavg()[0]:.2f}",
            "",
            "## Method",
            "",
            *method(args, run.wall_s, run.precise_cpu),
            "",
            "## A hit vs the same request's miss (streamed)",
            "",
            *hit_table(arms, [("exact", "exact_hit"), ("semantic", "semantic_hit")]),
            "",
            "## What the lookup adds to a miss (vs the cache off for the team)",
            "",
            *lookup_table(arms, MISSES, "off", "first_token"),
            "",
            *lookup_table(arms, MISSES, "off", "total"),
            "",
            "## CPU per request",
            "",
            *cpu_table(arms, [*MISSES, *HITS]),
            "",
            "## The servers' own figures over the counted rounds",
            "",
            *counters(run),
            "",
        ]
    )
