"""`python -m tools.bench <name> [options]`: one entry point for every benchmark."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS: dict[str, str] = {
    "platform": "whole platform vs direct to the engine: added TTFT, transit, CPU, memory per stream",
    "fastpaths": "each apps/netio fast path on/off, one platform per configuration, rotated in one run",
    "hotpath": "CPU per 1,000 relayed tokens of each platform process (before/after across trees)",
    "gateway": "the gateway alone in front of a fake zero-latency orchestrator: added TTFT, CPU",
    "dispatch": "the gateway's upstream client alone: aiohttp baseline vs the raw-protocol client",
    "engine": "enginesim's 8B profile vs the brief, loadgen's own overhead, a real vLLM on CPU",
    "settle": "latency and client CPU of one ledger settle against PostgreSQL",
    "console": "the console's full-year team page on 1,000,000 ledger rows vs the raw-ledger query",
    "prefix": "least-loaded vs prefix-aware picks: multi-turn, shared system prompt, random (TTFT, hit rate)",
    "fairqueue": "the orchestrator's fair queue vs the FIFO it replaced: CPU per request at 200 and 1,000 queued",
    "cache": "the response cache: a hit vs the same request's miss; a miss's lookup off / exact / semantic",
}


def usage() -> str:
    lines = ["usage: python -m tools.bench <name> [options]", "", "benchmarks:"]
    lines += [f"  {name:<9} {what}" for name, what in BENCHMARKS.items()]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in BENCHMARKS:
        print(usage(), file=sys.stderr if argv[:1] not in (["-h"], ["--help"]) else sys.stdout)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    module = importlib.import_module(f"tools.bench.{argv[0]}")
    sys.argv = [f"python -m tools.bench {argv[0]}", *argv[1:]]
    result = module.main(argv[1:])
    return int(result or 0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
