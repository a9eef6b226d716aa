"""The platform's own cost, side by side in one run (issue 5's benchmark).

  .venv/bin/python -m tools.bench platform [--streams 200,1000] [--arrivals steady,burst] [--repeat 3]
      [--max-tokens 64] [--out FILE]

It prints the page (method, machine, one row per run), and with `--out` also writes it there (outside
the repository); the current numbers go to docs/performance.md by hand, with date, machine and command.

One enginesim engine (8B profile, room for 1,024 sequences so the engine is never the
bottleneck) behind the whole platform (gateway -> orchestrator -> agent, real PostgreSQL
and Redis). For each concurrency, loadgen runs closed-loop twice, back to back:
direct to the engine, then through the gateway to the same engine. Reported:

- added TTFT p50/p99 = platform TTFT - direct TTFT (the same engine, the same load);
- added transit p50/p99 = platform transit - direct transit, where a request's transit is its
  client TTFT minus the engine's own TTFT for it (joined by the request's `user` tag with the
  engine's `--timing-log`): the engine's batching time cancels request by request;
- CPU seconds per 1,000 relayed tokens, summed over gateway + orchestrator + agent
  (psutil user+system time of each process, before/after the platform run);
- resident memory per open stream = (peak RSS during the run - idle RSS before it) of those
  three processes, divided by the number of concurrent streams.

PostgreSQL/Redis: `LLMFLEET_DATABASE_URL`/`LLMFLEET_REDIS_URL` (a fresh database is created on
that server and dropped afterwards) or the local servers on the standard ports.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from apps.cli.platform import MODEL_8B, LocalPlatform, NodeSpec, PlatformConfig
from apps.loadgen.config import LoadConfig
from apps.loadgen.runner import run_load
from apps.loadgen.transit import TransitStats, join_transit, read_timing_log
from tools.bench.common import DEFAULT_REDIS, admin_pg_url, fresh_database, machine, tree, tree_cpu_seconds
from tools.bench.platform_report import TRANSIT_SAMPLES, TTFT_SAMPLES, Run, pooled, render, row

TIMING_LOG = "engine-timing.jsonl"  # in the platform's data dir: the engine's --timing-log


class RssSampler:
    """Peak summed RSS of some processes, sampled on a thread until stopped."""

    def __init__(self, procs: list[psutil.Process]) -> None:
        self.procs = procs
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> int:
        return sum(p.memory_info().rss for p in tree(self.procs))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            self._stop.wait(0.1)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def load(
    base_url: str,
    api_key: str,
    streams: int,
    max_tokens: int,
    prompt_tokens: int,
    ramp_s: float = 0.0,
    timing: tuple[Path, str] | None = None,
) -> dict[str, Any]:
    """Burst (`ramp_s` 0): max(2N, 40) requests, the first N at once. Steady: 3N requests, the N
    streams' first requests spread over `ramp_s` (one request's duration), so arrivals stay even.

    `timing` (engine timing log, tag): tag the requests and join them with the log afterwards;
    the report gets `transit_ms` {ok, joined, p50, p99}."""
    config = LoadConfig(
        base_url=base_url,
        api_key=api_key,
        model=MODEL_8B,
        concurrency=streams,
        requests=3 * streams if ramp_s else max(streams * 2, 40),
        ramp_s=ramp_s,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        request_timeout_s=600,
        tag=timing[1] if timing else None,
    )
    result = asyncio.run(run_load(config))
    report: dict[str, Any] = result.to_json()
    report["output_tokens"] = result.output_tokens  # relayed tokens (usage counts), not a rate
    report[TTFT_SAMPLES] = [r.ttft_s for r in result.results if r.ttft_s is not None]
    if timing is not None:
        stats = _transit(timing[0], result.results)
        report["transit_ms"] = stats.to_json()
        report[TRANSIT_SAMPLES] = list(stats.transits_s)
    return report


def _transit(log: Path, results: list[Any], wait_s: float = 5.0) -> TransitStats:
    """Join a run's results with the engine's timing log. The engine writes its lines once its
    last stream has ended, which can be a moment after the client read `[DONE]`: re-read the log
    until every OK request is joined (or `wait_s` is up, and the report shows how many were)."""
    deadline = time.monotonic() + wait_s
    while True:
        stats = join_transit(results, read_timing_log(log))
        if stats.joined == stats.ok or time.monotonic() >= deadline:
            return stats
        time.sleep(0.05)


def _tag(mode: str, streams: int, arrivals: str) -> str:
    return f"{mode}-{streams}-{arrivals}-{uuid.uuid4().hex[:8]}"


def _scrape(url: str, family: str) -> tuple[float, float]:
    """(sum, count) of a histogram family, summed over its label sets."""
    with urllib.request.urlopen(url, timeout=10) as resp:  # loopback metrics endpoint we started
        text = resp.read().decode()
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith(family + "_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith(family + "_count"):
            count += float(line.rsplit(" ", 1)[1])
    return total, count


def _waits(platform: LocalPlatform) -> list[tuple[float, float]]:
    return [
        _scrape(platform.gateway_url + "/metrics", "llmfleet_gateway_dispatch_seconds"),
        _scrape(platform.orchestrator_url(0) + "/metrics", "llmfleet_orchestrator_queue_wait_seconds"),
    ]


def bench_platform_config(
    data_dir: Path, database_url: str, redis_url: str, speed: float, gateway_workers: int = 1
) -> PlatformConfig:
    """One gateway (`gateway_workers` processes), one orchestrator, one agent in front of an 8B
    enginesim with room for 1,024 sequences and 400,000 KV blocks, so that the engine is never the
    bottleneck."""
    node = NodeSpec(
        "bench-8b",
        MODEL_8B,
        "onprem",
        max_num_seqs=1024,
        engine_args=("--num-blocks", "400000", "--timing-log", str(data_dir / TIMING_LOG)),
    )
    return PlatformConfig(
        data_dir=data_dir,
        gateway_port=0,
        orchestrators=1,
        nodes=[node],
        database_url=database_url,
        redis_url=redis_url,
        speed=speed,
        ready_timeout_s=120,
        gateway_env={"LLMFLEET_WORKERS": str(gateway_workers)},
    )


def _platform_run(
    platform: LocalPlatform,
    relay: list[psutil.Process],
    streams: int,
    args: argparse.Namespace,
    ramp_s: float,
    arrivals: str,
    label: str = "",
) -> Run:
    assert platform.credentials is not None
    idle_rss = sum(p.memory_info().rss for p in tree(relay))
    cpu0 = tree_cpu_seconds(relay)
    waits0 = _waits(platform)
    with RssSampler(relay) as sampler:
        via = load(
            platform.gateway_url + "/v1",
            platform.credentials.api_key,
            streams,
            args.max_tokens,
            args.prompt_tokens,
            ramp_s,
            (platform.data_dir / TIMING_LOG, _tag("platform", streams, arrivals)),
        )
    run = Run("platform", streams, via, arrivals, label, cpu_s=tree_cpu_seconds(relay) - cpu0)
    run.rss_per_stream_kib = max(0, sampler.peak - idle_rss) / 1024 / streams
    means = [
        (s1 - s0) / (c1 - c0) * 1000 if c1 > c0 else float("nan")
        for (s0, c0), (s1, c1) in zip(waits0, _waits(platform), strict=True)
    ]
    run.waits_ms = " / ".join(f"{m:.0f}" for m in means)
    return run


@contextmanager
def bench_platform(
    speed: float, gateway_workers: int = 1
) -> Iterator[tuple[LocalPlatform, dict[str, psutil.Process]]]:
    """The benchmark's platform on a fresh database, and its processes by role (engine, gateway,
    orchestrator, agent). Shared with `tools.bench.hotpath`."""
    redis_url = os.environ.get("LLMFLEET_REDIS_URL", DEFAULT_REDIS)
    with (
        fresh_database(admin_pg_url(), "llmfleet_platbench") as db_url,
        tempfile.TemporaryDirectory(prefix="llmfleet-bench-") as tmp,
    ):
        config = bench_platform_config(Path(tmp), db_url, redis_url, speed, gateway_workers)
        node = config.nodes[0]
        with LocalPlatform(config) as platform:
            assert platform.credentials is not None
            children = {c.name: psutil.Process(c.pid) for c in platform.supervisor.children}
            procs = {
                "gateway": children["gateway"],
                "orchestrator": children["orchestrator-0"],
                "agent": children[f"agent-{node.node_id}"],
            }
            engines = [p for name, p in children.items() if name.startswith(("engine", "enginesim"))]
            if engines:
                procs["engine"] = engines[0]
            # Warm-up: connection pools, cache-warm paths, JWKS/key caches.
            load(platform.engines[node.node_id].url + "/v1", "", 20, 8, 128)
            load(platform.gateway_url + "/v1", platform.credentials.api_key, 20, 8, 128)
            yield platform, procs


def _direct(
    platform: LocalPlatform, streams: int, args: argparse.Namespace, ramp: float, arrivals: str
) -> Run:
    engine = next(iter(platform.engines.values()))
    log = platform.data_dir / TIMING_LOG
    report = load(
        engine.url + "/v1", "", streams, args.max_tokens, args.prompt_tokens, ramp,
        (log, _tag("direct", streams, arrivals)),
    )  # fmt: skip
    return Run("direct", streams, report, arrivals)


def _group(
    platform: LocalPlatform, relay: list[psutil.Process], streams: int, args: argparse.Namespace, ramp: float,
    arrivals: str, first_direct: Run | None,
) -> list[Run]:  # fmt: skip
    """`--repeat` alternating direct/platform pairs at one concurrency and arrival pattern, then pooled."""
    pairs: list[tuple[Run, Run]] = []
    for i in range(args.repeat):
        direct = first_direct if (first_direct is not None and i == 0) else None
        direct = direct or _direct(platform, streams, args, ramp, arrivals)
        direct.label = str(i + 1) if args.repeat > 1 else ""
        pair = (direct, _platform_run(platform, relay, streams, args, ramp, arrivals, direct.label))
        pairs.append(pair)
        print(row(*pair), flush=True)
    runs = [run for pair in pairs for run in pair]
    if args.repeat > 1:
        runs.extend(pooled(pairs))
        print(row(runs[-2], runs[-1]), flush=True)
    return runs


def bench(args: argparse.Namespace) -> list[Run]:
    runs: list[Run] = []
    with bench_platform(args.speed, args.gateway_workers) as (platform, procs):
        relay = [procs["gateway"], procs["orchestrator"], procs["agent"]]
        for streams in args.streams:
            burst_direct = _direct(platform, streams, args, 0.0, "burst")
            # Steady arrivals: the streams' starts spread over one request's duration (direct, burst).
            ramp_s = float(burst_direct.report["e2e_ms"]["p50"] or 0.0) / 1000
            for arrivals in args.arrivals:
                steady = arrivals == "steady"
                first = None if steady else burst_direct
                runs += _group(platform, relay, streams, args, ramp_s if steady else 0.0, arrivals, first)
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", default="10,200,1000", help="comma-separated concurrencies")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument(
        "--gateway-workers", type=int, default=1, help="gateway worker processes (LLMFLEET_WORKERS)"
    )
    parser.add_argument("--arrivals", default="burst,steady", help="comma-separated: burst, steady")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="direct/platform pairs per concurrency and arrivals, alternating; with more than one, "
        "a pooled row (percentiles over every pair's samples) follows them",
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the page to this file")
    args = parser.parse_args(argv)
    args.streams = [int(s) for s in args.streams.split(",")]
    args.arrivals = [a.strip() for a in args.arrivals.split(",") if a.strip()]
    if not args.arrivals or set(args.arrivals) - {"burst", "steady"}:
        parser.error("--arrivals takes burst and/or steady")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    about = machine() | {"loop": "uvloop (gateway) / asyncio (orchestrator, agent)"}
    text = render(bench(args), about, args)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
