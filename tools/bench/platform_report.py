"""The rows and the page of `tools.bench.platform`: one run's figures, a direct/platform pair as a
table row, several pairs pooled (`--repeat`), and the Markdown page with its method."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from apps.loadgen.report import percentile
from apps.loadgen.transit import added

TTFT_SAMPLES = "_ttft_s"  # report keys of a run's raw samples (for the pooled rows of --repeat)
TRANSIT_SAMPLES = "_transit_s"


@dataclass
class Run:
    target: str
    streams: int
    report: dict[str, Any]
    arrivals: str = "burst"
    label: str = ""  # "" for a single run; with --repeat: "1", "2", ... and "pooled"
    cpu_s: float = 0.0
    rss_per_stream_kib: float = 0.0
    waits_ms: str = ""  # mean gateway dispatch time / orchestrator queue wait during the run

    @property
    def tokens(self) -> int:
        return int(self.report["output_tokens"])


def _pool_report(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report over several runs' samples: percentiles of all their TTFTs and transits."""
    ttfts = [t for r in reports for t in r[TTFT_SAMPLES]]
    transits = [t for r in reports for t in r.get(TRANSIT_SAMPLES, [])]

    def ms(values: list[float], q: float) -> float | None:
        v = percentile(values, q)
        return None if v is None else v * 1000

    return {
        "ttft_ms": {"p50": ms(ttfts, 50), "p99": ms(ttfts, 99)},
        "transit_ms": {
            "ok": sum(r["transit_ms"]["ok"] for r in reports),
            "joined": sum(r["transit_ms"]["joined"] for r in reports),
            "p50": ms(transits, 50),
            "p99": ms(transits, 99),
        },
        "output_tokens": sum(r["output_tokens"] for r in reports),
        "requests": {k: sum(r["requests"][k] for r in reports) for k in ("ok", "error")},
        "errors_by_status": {},
        TTFT_SAMPLES: ttfts,
        TRANSIT_SAMPLES: transits,
    }


def pooled(pairs: list[tuple[Run, Run]]) -> tuple[Run, Run]:
    """The direct and platform runs of `--repeat`, each pooled into one: every sample of the
    alternating runs counts once, so run-to-run drift of the engine's timing averages out."""
    direct = [d for d, _ in pairs]
    via = [p for _, p in pairs]
    first = via[0]
    merged = Run("platform", first.streams, _pool_report([p.report for p in via]), first.arrivals, "pooled")
    merged.cpu_s = sum(p.cpu_s for p in via)
    merged.rss_per_stream_kib = max(p.rss_per_stream_kib for p in via)
    merged.report["errors_by_status"] = {k: v for p in via for k, v in p.report["errors_by_status"].items()}
    merged.waits_ms = "n/a"
    return Run(
        "direct", first.streams, _pool_report([d.report for d in direct]), first.arrivals, "pooled"
    ), merged


def _ms(v: Any) -> str:
    return "n/a" if v is None else f"{v:.1f}"


def _transit_cells(direct: Run, via: Run) -> tuple[str, str, str]:
    """(transit direct | platform, added transit, joined) cells of a row."""
    empty = {"ok": 0, "joined": 0, "p50": None, "p99": None}
    d, p = direct.report.get("transit_ms", empty), via.report.get("transit_ms", empty)
    both = f"{_ms(d['p50'])} / {_ms(d['p99'])} \\| {_ms(p['p50'])} / {_ms(p['p99'])}"
    add = f"**{_ms(added(p['p50'], d['p50']))} / {_ms(added(p['p99'], d['p99']))}**"
    joined = f"joined {d['joined']}/{d['ok']} direct, {p['joined']}/{p['ok']} platform"
    return both, add, joined


def row(direct: Run, via: Run) -> str:
    d, p = direct.report["ttft_ms"], via.report["ttft_ms"]
    add50, add99 = added(p["p50"], d["p50"]), added(p["p99"], d["p99"])
    transit, add_transit, joined = _transit_cells(direct, via)
    cpu_per_k = via.cpu_s / (via.tokens / 1000) if via.tokens else float("nan")
    errs = via.report["requests"]["error"]
    by_status = f" {via.report['errors_by_status']}" if via.report["errors_by_status"] else ""
    run = f"| {via.label} " if via.label else ""
    return (
        f"{run}| {via.streams} | {via.arrivals} | {_ms(d['p50'])} / {_ms(d['p99'])} | {_ms(p['p50'])} / {_ms(p['p99'])} | "
        f"**{_ms(add50)} / {_ms(add99)}** | {transit} | {add_transit} | {via.waits_ms} | {cpu_per_k:.3f} | "
        f"{via.rss_per_stream_kib:.0f} | "
        f"{via.report['requests']['ok']} ok, {errs} errors{by_status}; {joined} |"
    )


def _method(args: argparse.Namespace) -> list[str]:
    """The page's method section: how the rows were measured."""
    return [
        "- Closed loop, N concurrent streams. *burst*: max(2·N, 40) requests per run, the first N sent at "
        "once (a thundering herd: per-request work queues up). *steady*: 3·N requests, the N streams' first "
        "requests spread evenly over one request's duration (the direct burst run's E2E p50), so N streams "
        "stay open with arrivals spread out — the steady state of N concurrent streams.",
        f"- Prompt {args.prompt_tokens} tokens, "
        f"`max_tokens` {args.max_tokens} (`ignore_eos`), enginesim 8B profile at `--speed {args.speed}` "
        "with 1,024 sequences and 400,000 KV blocks (the engine is never the bottleneck).",
        "- One gateway, one orchestrator, one agent (one process each), real PostgreSQL 15 and Redis 7 "
        "on loopback; every platform request is authenticated, admitted (Redis), reserved and settled "
        "(PostgreSQL).",
        *(
            [
                f"- {args.repeat} direct/platform pairs per row group, alternating (direct, platform, direct, "
                "...); the *pooled* row takes its percentiles over every sample of the group's runs, so "
                "drift of the engine's timing between runs averages out."
            ]
            if args.repeat > 1
            else []
        ),
        "- Added TTFT = platform TTFT - direct TTFT at the same percentile. Both are ~all engine time "
        "(its simulated batching), so this difference of two large numbers moves by a few ms run to run.",
        "- Transit (per request) = client TTFT (first content chunk received - request sent, in loadgen) "
        "- engine TTFT (first content chunk written - request received, in enginesim's `--timing-log`), "
        "joined by a unique `user` tag per request, which the platform relays to the engine as sent. "
        "This cancels the engine's batching time request by request, leaving the client, loopback and "
        "(for the platform) gateway → orchestrator → agent time. Every timestamp is `time.monotonic()` "
        "(CLOCK_MONOTONIC), one clock for all processes on this machine. Added transit = platform "
        "transit - direct transit at the same percentile; *joined* counts the OK requests that found "
        "their engine timing (all of them, normally).",
        "- CPU = user+system seconds of gateway + orchestrator + agent during the platform run, per 1,000 "
        "relayed output tokens.",
        "- Memory = (peak RSS during the run - idle RSS before it) of the same three processes / N.",
        "- Loadgen runs in the benchmark process on the same 2 cores, so it competes with the platform "
        "for CPU: the numbers are an upper bound on overhead.",
    ]


def render(runs: list[Run], machine: dict[str, str], args: argparse.Namespace) -> str:
    pairs = list(zip(runs[0::2], runs[1::2], strict=True))
    lines = [
        "# Platform overhead benchmark (issue 5)",
        "",
        "Generated by `python -m tools.bench platform` — loadgen direct to one enginesim engine vs loadgen →",
        "gateway → orchestrator → agent → the same engine, back to back in one run.",
        "",
        "## Machine",
        "",
        *[f"- {k}: {v}" for k, v in machine.items()],
        "",
        "## Method",
        "",
        *_method(args),
        "",
        "## Results",
        "",
        ("| run " if args.repeat > 1 else "")
        + "| streams | arrivals | direct TTFT p50 / p99 ms | platform TTFT p50 / p99 ms | added p50 / p99 ms | "
        "transit p50 / p99 ms (direct \\| platform) | **added transit p50 / p99** ms | "
        "mean gateway dispatch / orchestrator queue wait ms | CPU s / 1k tokens | RSS KiB / stream | platform requests |",
        ("|---" if args.repeat > 1 else "") + "|---|---|---|---|---|---|---|---|---|---|---|",
        *[row(d, p) for d, p in pairs],
        "",
        "Targets (issue 5): added TTFT p50 ≤ 5 ms and p99 ≤ 20 ms at 200 streams; 1,000 streams held "
        "with no errors.",
        "",
    ]
    return "\n".join(lines)
