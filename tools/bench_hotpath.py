"""Per-process CPU per 1,000 relayed tokens (gateway, orchestrator, agent, engine), platform path only.

Method: one `LocalPlatform` (one gateway, one orchestrator, one agent in front of an enginesim 8B engine that is never
the bottleneck), a warm-up, then `--rounds` closed-loop rounds of `--streams` concurrent streams through the gateway;
for each round the user+system CPU of every process (psutil) divided by the output tokens the round relayed. The
engine's figure is the noise reference: its code is the same in any before/after comparison, so compare two source
trees by running this tool from each tree alternately in one session (that is how `docs/bench/hotpath.md` was made).

    .venv/bin/python tools/bench_hotpath.py [--streams 200] [--rounds 3] [--max-tokens 64,256]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_platform import DEFAULT_PG, DEFAULT_REDIS, _load, _with_db, bench_platform_config

from apps.cli.platform import LocalPlatform


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", default="64", help="comma-separated answer lengths")
    parser.add_argument("--speed", type=float, default=1.0)
    args = parser.parse_args()
    print(__doc__)
    admin_url = os.environ.get("LLMFLEET_DATABASE_URL", DEFAULT_PG)
    dbname = f"llmfleet_hot_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}"')
    try:
        with tempfile.TemporaryDirectory(prefix="llmfleet-hot-") as tmp:
            config = bench_platform_config(Path(tmp), _with_db(admin_url, dbname), DEFAULT_REDIS, args.speed)
            with LocalPlatform(config) as platform:
                assert platform.credentials is not None
                children = {c.name: psutil.Process(c.pid) for c in platform.supervisor.children}
                procs = {
                    "gateway": children["gateway"],
                    "orchestrator": children["orchestrator-0"],
                    "agent": children["agent-bench-8b"],
                }
                engines = [p for name, p in children.items() if name.startswith(("engine", "enginesim"))]
                if engines:
                    procs["engine"] = engines[0]
                base = platform.gateway_url + "/v1"
                _load(base, platform.credentials.api_key, 20, 8, 128)  # warm-up
                results = []
                for max_tokens in (int(m) for m in args.max_tokens.split(",")):
                    for round_ in range(args.rounds):
                        before = {name: _cpu(p) for name, p in procs.items()}
                        start = time.monotonic()
                        report = _load(base, platform.credentials.api_key, args.streams, max_tokens, 128)
                        tokens = report["output_tokens"]
                        row = {
                            "round": round_,
                            "max_tokens": max_tokens,
                            "tokens": tokens,
                            "wall_s": round(time.monotonic() - start, 2),
                            "errors": report["requests"]["error"],
                            **{
                                n: round((_cpu(p) - before[n]) / (tokens / 1000), 4) for n, p in procs.items()
                            },
                        }
                        print(json.dumps(row), flush=True)
                        results.append(row)
                median = {k: sorted(r[k] for r in results)[len(results) // 2] for k in procs}
                print("median CPU s per 1,000 tokens:", json.dumps(median))
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


if __name__ == "__main__":
    main()
