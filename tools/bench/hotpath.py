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
import time
from collections.abc import Sequence
from typing import Any

import psutil

from tools.bench.common import tree_cpu_seconds
from tools.bench.platform import bench_platform, load


def _round(
    base: str, key: str, procs: dict[str, psutil.Process], streams: int, max_tokens: int
) -> dict[str, Any]:
    before = {name: tree_cpu_seconds([p]) for name, p in procs.items()}
    start = time.monotonic()
    report = load(base, key, streams, max_tokens, 128)
    tokens = report["output_tokens"]
    return {
        "max_tokens": max_tokens,
        "tokens": tokens,
        "wall_s": round(time.monotonic() - start, 2),
        "errors": report["requests"]["error"],
        **{n: round((tree_cpu_seconds([p]) - before[n]) / (tokens / 1000), 4) for n, p in procs.items()},
    }


def main(argv: Sequence[str] | None = None) -> None:
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
        results = []
        for max_tokens in (int(m) for m in args.max_tokens.split(",")):
            for round_ in range(args.rounds):
                row = {"round": round_, **_round(base, key, procs, args.streams, max_tokens)}
                print(json.dumps(row), flush=True)
                results.append(row)
    median = {k: sorted(r[k] for r in results)[len(results) // 2] for k in procs}
    print("median CPU s per 1,000 tokens:", json.dumps(median))


if __name__ == "__main__":
    main()
