"""Per-process CPU per 1,000 relayed tokens (gateway, orchestrator, agent, engine), platform path only.

Method: one `LocalPlatform` (one gateway, one orchestrator, one agent in front of an enginesim 8B engine that is never
the bottleneck), a warm-up, then `--rounds` closed-loop rounds of `--streams` concurrent streams through the gateway;
for each round the user+system CPU of every process (psutil) divided by the output tokens the round relayed. The
engine's figure is the noise reference: its code is the same in any before/after comparison, so compare two source
trees by running this tool from each tree alternately in one session (that is how the hot-path numbers in docs/performance.md were made).

    .venv/bin/python -m tools.bench hotpath [--streams 200] [--rounds 3] [--max-tokens 64,256]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import psutil

from tools.bench.common import tree_cpu_seconds
from tools.bench.platform import bench_platform, load


class BenchFailed(Exception):
    """A round produced nothing to measure (every request failed)."""


Load = Callable[[str, str, int, int, int], dict[str, Any]]


def _round(
    base: str, key: str, procs: dict[str, psutil.Process], streams: int, max_tokens: int, load_fn: Load = load
) -> dict[str, Any]:
    before = {name: tree_cpu_seconds([p]) for name, p in procs.items()}
    start = time.monotonic()
    report = load_fn(base, key, streams, max_tokens, 128)
    tokens = report["output_tokens"]
    if not tokens:
        # Nothing relayed: no CPU per token to report (it was a ZeroDivisionError).
        raise BenchFailed(
            f"a round of {streams} streams (max_tokens {max_tokens}) relayed no tokens: "
            f"{report['requests']['error']} request(s) failed"
        )
    return {
        "max_tokens": max_tokens,
        "tokens": tokens,
        "wall_s": round(time.monotonic() - start, 2),
        "errors": report["requests"]["error"],
        **{n: round((tree_cpu_seconds([p]) - before[n]) / (tokens / 1000), 4) for n, p in procs.items()},
    }


def run_rounds(measure: Callable[[int], dict[str, Any]], lengths: list[int], rounds: int) -> int:
    """Every round of every answer length, one JSON row each, then the medians; 1 (with the reason on
    stderr) when a round had nothing to measure."""
    results = []
    try:
        for max_tokens in lengths:
            for round_ in range(rounds):
                row = {"round": round_, **measure(max_tokens)}
                print(json.dumps(row), flush=True)
                results.append(row)
    except BenchFailed as exc:
        print(f"hotpath: no measurement: {exc}", file=sys.stderr)
        return 1
    names = [k for k in results[0] if k not in ("round", "max_tokens", "tokens", "wall_s", "errors")]
    median = {k: sorted(r[k] for r in results)[len(results) // 2] for k in names}
    print("median CPU s per 1,000 tokens:", json.dumps(median))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", default="64", help="comma-separated answer lengths")
    parser.add_argument("--speed", type=float, default=1.0)
    args = parser.parse_args(argv)
    print(__doc__)
    with bench_platform(args.speed) as (platform, procs):
        assert platform.credentials is not None
        base, key = platform.gateway_url + "/v1", platform.credentials.api_key
        lengths = [int(m) for m in args.max_tokens.split(",")]
        return run_rounds(lambda m: _round(base, key, procs, args.streams, m), lengths, args.rounds)


if __name__ == "__main__":
    raise SystemExit(main())
