"""Gateway overhead benchmark: client -> gateway -> fake zero-latency orchestrator, versus
client -> the same fake directly, side by side in one run.

    .venv/bin/python -m tools.bench gateway [--streams 200] [--rounds 3] [--requests 3] [--workers 1,2]
                                            [--guardrails]

What runs (all on loopback, separate processes so CPU is attributable):
  * the fake orchestrator (`tools.bench.wire`, a child process): a raw asyncio protocol on uvloop
    that answers every POST (`/internal/v1/dispatch` from the gateway, `/v1/chat/completions` from
    the client) with a vLLM-like chunked SSE stream: role chunk and first content chunk at once,
    then one content chunk every `--token-interval-ms` (20 ms = 50 tokens/s per stream, the
    brief's decode speed), then the finish chunk and `[DONE]`. Frames are pre-encoded and paced
    with `loop.call_at`, so the fake costs little more than its socket writes;
  * one `llmfleet gateway --workers N` per value of `--workers` (each a separate process tree,
    idle outside its own rounds) against real PostgreSQL and Redis (a fresh migrated database; a
    team with credits; one key without quotas);
  * the load client (this process, uvloop, a raw asyncio protocol per client connection):
    `--streams` concurrent clients, each issuing `--requests` streaming requests in sequence on one
    keep-alive connection, starts spread over one request duration so arrivals are steady.

With `--guardrails`, each gateway also serves a second team whose guardrail policy (docs/guardrails.md)
screens every request (`ssn` block, `email` and `phone` redact, `dob` flag) and every answer (the same
four detectors, redact): mode `<gateway>_guardrails`, the same process and port with that team's key,
so the added TTFT and CPU of enabled checks are measured side by side with the unscreened team.

Each round runs `direct`, then every gateway configuration, with the same client. Reported per
mode: TTFT (request written -> first content chunk received) p50/p99/mean, the added TTFT
(gateway - direct, per percentile), and the CPU seconds (user + system, psutil, summed over the
process tree) of the gateway, the fake and the client per 1,000 relayed tokens (one chunk = one
token). The load average is printed because the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

import psutil
from psycopg_pool import AsyncConnectionPool

from apps.cli.procs import llmfleet_argv
from apps.core.db.migrate import migrate_sync
from apps.core.guardrails.policy import parse_policy
from apps.core.guardrails.store import GuardrailStore
from apps.core.identity.keys import KeyStore
from apps.core.ledger.teams import TeamStore
from tools.bench.common import (
    Child,
    Supervisor,
    admin_pg_url,
    free_port,
    fresh_database,
    loop_factory,
    pct,
    self_cpu_seconds,
    tree_cpu_seconds,
)
from tools.bench.wire import one_round, request_bytes, start_fake_orchestrator

GUARDED = ("ssn", "email", "phone", "dob")
INPUT_ACTIONS = {"ssn": "block", "email": "redact", "phone": "redact", "dob": "flag"}


async def _key(db_url: str, secret: str, name: str = "bench", guarded: bool = False) -> str:
    """A team with credits and one key without quotas; `guarded`: the team has the bench's policy."""
    async with AsyncConnectionPool(db_url, min_size=1, max_size=2) as pool:
        team = await TeamStore(pool).create_team(name)
        await TeamStore(pool).add_credits(team.id, 10**15)
        key, _ = await KeyStore(pool, secret.encode()).create(team=team.id)
        if guarded:
            policy = {
                "input": [{"detector": d, "action": INPUT_ACTIONS[d]} for d in GUARDED],
                "output": [{"detector": d, "action": "redact"} for d in GUARDED],
            }
            await GuardrailStore(pool).put(team.id, parse_policy(policy))
    return key


def _start_gateways(
    supervisor: Supervisor, args: argparse.Namespace, env: dict[str, str], workers: list[int]
) -> dict[str, tuple[int, Child]]:
    modes: dict[str, tuple[int, Child]] = {}
    if args.baseline_tree:
        # The same gateway from another source tree (e.g. `git archive HEAD`), for before/after.
        port = free_port()
        cmd = ["env", "--chdir", args.baseline_tree, f"PYTHONPATH={args.baseline_tree}"]
        cmd += llmfleet_argv("gateway", "--port", str(port))
        modes["baseline"] = (port, supervisor.start("gateway-baseline", cmd, env))
    for n in workers:
        port = free_port()
        cmd = llmfleet_argv("gateway", "--port", str(port), "--workers", str(n))
        modes[f"gateway_w{n}"] = (port, supervisor.start(f"gateway-w{n}", cmd, env))
    for port, child in modes.values():
        supervisor.wait_http_ok(child, f"http://127.0.0.1:{port}/livez")
    return modes


# ---------------------------------------------------------------- the run
class Tally:
    """One mode's samples over every round."""

    def __init__(self) -> None:
        self.ttfts: list[float] = []
        self.errors = 0
        self.tokens = 0
        self.cpu = {"server": 0.0, "fake": 0.0, "client": 0.0}


async def _rounds(
    args: argparse.Namespace,
    modes: dict[str, tuple[int, psutil.Process]],
    fake: psutil.Process,
    keys: dict[str, str],
) -> tuple[dict[str, Tally], list[float]]:
    raws = {
        name: request_bytes(port, "/v1/chat/completions", keys.get(name, "direct"), args.tokens)
        for name, (port, _proc) in modes.items()
    }
    warm = 20 * max(args.workers, default=1)
    for name, (port, _proc) in modes.items():
        if name != "direct":  # warm-up: connection pools, key cache, prepared statements
            await one_round(port, raws[name], warm, 2, 0.0)
    stagger = args.tokens * args.token_interval_ms / 1000
    tallies = {m: Tally() for m in modes}
    load: list[float] = []
    for _ in range(args.rounds):
        for name, (port, proc) in modes.items():
            tally = tallies[name]
            before = (tree_cpu_seconds([proc]), tree_cpu_seconds([fake]), self_cpu_seconds())
            values, err, chunks = await one_round(port, raws[name], args.streams, args.requests, stagger)
            after = (tree_cpu_seconds([proc]), tree_cpu_seconds([fake]), self_cpu_seconds())
            for k, b, a in zip(("server", "fake", "client"), before, after, strict=True):
                tally.cpu[k] += a - b
            tally.ttfts += values
            tally.errors += err
            tally.tokens += chunks
            load.append(os.getloadavg()[0])
    return tallies, load


def _summary(args: argparse.Namespace, tallies: dict[str, Tally], load: list[float]) -> dict[str, object]:
    out: dict[str, object] = {
        "streams": args.streams,
        "tokens_per_request": args.tokens,
        "token_interval_ms": args.token_interval_ms,
        "rounds": args.rounds,
        "load_avg_1m_after_each_mode": [round(x, 2) for x in load],
    }
    direct = tallies["direct"].ttfts
    for name, tally in tallies.items():
        values = tally.ttfts or [float("nan")]
        row: dict[str, object] = {
            "requests": len(tally.ttfts),
            "errors": tally.errors,
            "ttft_ms": {
                "p50": round(pct(values, 0.5) * 1000, 2),
                "p99": round(pct(values, 0.99) * 1000, 2),
                "mean": round(statistics.mean(values) * 1000, 2),
            },
            "cpu_s_per_1000_tokens": {
                k: round(v / max(tally.tokens, 1) * 1000, 4) for k, v in tally.cpu.items()
            },
        }
        if name != "direct":
            row["added_ttft_ms"] = {
                "p50": round((pct(values, 0.5) - pct(direct, 0.5)) * 1000, 2),
                "p99": round((pct(values, 0.99) - pct(direct, 0.99)) * 1000, 2),
            }
            row["gateway_cpu_ms_per_request"] = round(tally.cpu["server"] / max(len(values), 1) * 1000, 3)
        out[name] = row
    return out


async def bench(args: argparse.Namespace) -> dict[str, object]:
    with fresh_database(args.pg) as db_url, tempfile.TemporaryDirectory(prefix="llmfleet-bench-") as tmp:
        migrate_sync(db_url)
        secret = "bench-secret"
        key = await _key(db_url, secret)
        supervisor = Supervisor(Path(tmp))
        try:
            fake, fake_port = start_fake_orchestrator(supervisor, args.tokens, args.token_interval_ms)
            env = {
                "LLMFLEET_DATABASE_URL": db_url,
                "LLMFLEET_REDIS_URL": args.redis,
                "LLMFLEET_ORCHESTRATOR_URL": f"http://127.0.0.1:{fake_port}",
                "LLMFLEET_SECRET_KEY": secret,
                "LLMFLEET_INTERNAL_TOKEN": "bench",
                "LLMFLEET_STACK": "dev",
                # PostgreSQL is shared with other test runs (max_connections 100): cap every gateway
                # process's hot-path pool; reservations are single short statements.
                "LLMFLEET_PG_POOL_MAX": str(args.pg_pool_max),
            }
            gateways = _start_gateways(supervisor, args, env, args.workers)
            modes = {"direct": (fake_port, psutil.Process(fake.pid))}
            modes |= {name: (port, psutil.Process(child.pid)) for name, (port, child) in gateways.items()}
            keys = {name: key for name in gateways}
            if args.guardrails:
                guarded = await _key(db_url, secret, "bench-guarded", guarded=True)
                for name in gateways:
                    modes[f"{name}_guardrails"] = modes[name]
                    keys[f"{name}_guardrails"] = guarded
            tallies, load = await _rounds(args, modes, modes["direct"][1], keys)
            return _summary(args, tallies, load)
        finally:
            supervisor.stop_all()


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--token-interval-ms", type=float, default=20.0, help="0 = burst (saturation test)")
    parser.add_argument("--workers", default="1,2", help="gateway worker counts, compared side by side")
    parser.add_argument("--baseline-tree", default="", help="also run the gateway from this source tree")
    parser.add_argument("--pg-pool-max", type=int, default=6, help="per gateway process")
    parser.add_argument(
        "--guardrails", action="store_true", help="also a team with a guardrail policy on each gateway"
    )
    parser.add_argument("--pg", default=admin_pg_url())
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/9")
    args = parser.parse_args(argv)
    args.workers = [int(w) for w in args.workers.split(",") if w.strip()]
    # SIGTERM unwinds like Ctrl-C, so the child processes and the database are cleaned up.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        print(json.dumps(runner.run(bench(args)), indent=2))


if __name__ == "__main__":
    main()
