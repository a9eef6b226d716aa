"""Gateway overhead benchmark: client -> gateway -> fake zero-latency orchestrator, versus
client -> the same fake directly, side by side in one run.

    .venv/bin/python tools/bench_gateway.py [--streams 200] [--rounds 3] [--requests 3] [--workers 1,2]

What runs (all on loopback, separate processes so CPU is attributable):
  * the fake orchestrator (this script with `--serve-fake PORT`): a raw asyncio protocol on uvloop
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

Each round runs `direct`, then every gateway configuration, with the same client. Reported per
mode: TTFT (request written -> first content chunk received) p50/p99/mean, the added TTFT
(gateway - direct, per percentile), and the CPU seconds (utime + stime from /proc, summed over the
process tree) of the gateway, the fake and the client per 1,000 relayed tokens (one chunk = one
token). The load average is printed because the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_wire import free_port, loop_factory, one_round, request_bytes, serve_fake  # noqa: E402


def spawn(
    cmd: list[str], env: dict[str, str] | None = None, quiet: bool = False, cwd: str | None = None
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, env=env, cwd=cwd, stderr=subprocess.DEVNULL if quiet else None)


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def tree_cpu_seconds(root: int) -> float:
    """utime + stime of `root` and all its live descendants (gateway workers are children)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat(int(entry))
        if fields is None:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    members = {root}
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in members and pid not in members:
                members.add(pid)
                grew = True
    return sum(times.get(p, 0.0) for p in members)


def self_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def wait_http(port: int, path: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            line = await reader.readline()
            writer.close()
            if line.startswith(b"HTTP/1.1 2"):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"port {port} did not come up")
        await asyncio.sleep(0.1)


# ---------------------------------------------------------------- the run
async def bench(args: argparse.Namespace) -> dict[str, object]:
    import psycopg
    from psycopg_pool import AsyncConnectionPool

    from apps.core.db.migrate import migrate_sync
    from apps.core.identity.keys import KeyStore
    from apps.core.ledger.teams import TeamStore

    workers = [int(w) for w in args.workers.split(",") if w.strip()]
    db = f"llmfleet_bench_{uuid.uuid4().hex[:8]}"
    admin_url = args.pg
    with psycopg.connect(admin_url, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{db}"')
    db_url = admin_url.rsplit("/", 1)[0] + "/" + db
    procs: list[subprocess.Popen[bytes]] = []
    try:
        migrate_sync(db_url)
        secret = "bench-secret"
        async with AsyncConnectionPool(db_url, min_size=1, max_size=2) as pool:
            team = await TeamStore(pool).create_team("bench")
            await TeamStore(pool).add_credits(team.id, 10**15)
            key, _ = await KeyStore(pool, secret.encode()).create(team=team.id)
        fake_port = free_port()
        fake = spawn(
            [
                sys.executable,
                __file__,
                "--serve-fake",
                str(fake_port),
                "--tokens",
                str(args.tokens),
                "--token-interval-ms",
                str(args.token_interval_ms),
            ]
        )
        procs.append(fake)
        env = {
            **os.environ,
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
        modes: dict[str, tuple[int, int]] = {"direct": (fake_port, fake.pid)}
        if args.baseline_tree:
            # The same gateway from another source tree (e.g. `git archive HEAD`), for before/after.
            port = free_port()
            base_env = {**env, "PYTHONPATH": args.baseline_tree}
            cmd = [sys.executable, "-m", "apps.cli.main", "gateway", "--port", str(port)]
            gw = spawn(cmd, env=base_env, quiet=not args.gateway_logs, cwd=args.baseline_tree)
            procs.append(gw)
            modes["baseline"] = (port, gw.pid)
        for n in workers:
            port = free_port()
            cmd = [str(ROOT / ".venv/bin/llmfleet"), "gateway", "--port", str(port), "--workers", str(n)]
            gw = spawn(cmd, env=env, quiet=not args.gateway_logs)
            procs.append(gw)
            modes[f"gateway_w{n}"] = (port, gw.pid)
        await wait_http(fake_port, "/")
        for name, (port, _pid) in modes.items():
            if name != "direct":
                await wait_http(port, "/livez")
        raws = {
            name: request_bytes(
                port, "/v1/chat/completions", key if name != "direct" else "direct", args.tokens
            )
            for name, (port, _pid) in modes.items()
        }
        for name, (port, _pid) in modes.items():
            if name != "direct":  # warm-up: connection pools, key cache, prepared statements
                await one_round(port, raws[name], 20 * max(workers, default=1), 2, 0.0)
        stagger = args.tokens * args.token_interval_ms / 1000
        ttfts: dict[str, list[float]] = {m: [] for m in modes}
        errors = dict.fromkeys(modes, 0)
        tokens = dict.fromkeys(modes, 0)
        cpu: dict[str, dict[str, float]] = {m: {"server": 0.0, "fake": 0.0, "client": 0.0} for m in modes}
        load: list[float] = []
        for _ in range(args.rounds):
            for name, (port, pid) in modes.items():
                before = (tree_cpu_seconds(pid), tree_cpu_seconds(fake.pid), self_cpu_seconds())
                values, err, chunks = await one_round(port, raws[name], args.streams, args.requests, stagger)
                after = (tree_cpu_seconds(pid), tree_cpu_seconds(fake.pid), self_cpu_seconds())
                cpu[name]["server"] += after[0] - before[0]
                cpu[name]["fake"] += after[1] - before[1]
                cpu[name]["client"] += after[2] - before[2]
                ttfts[name] += values
                errors[name] += err
                tokens[name] += chunks
                load.append(os.getloadavg()[0])
        out: dict[str, object] = {
            "streams": args.streams,
            "tokens_per_request": args.tokens,
            "token_interval_ms": args.token_interval_ms,
            "rounds": args.rounds,
            "load_avg_1m_after_each_mode": [round(x, 2) for x in load],
        }
        direct = ttfts["direct"]
        for name in modes:
            values = ttfts[name] or [float("nan")]
            row: dict[str, object] = {
                "requests": len(ttfts[name]),
                "errors": errors[name],
                "ttft_ms": {
                    "p50": round(pct(values, 0.5) * 1000, 2),
                    "p99": round(pct(values, 0.99) * 1000, 2),
                    "mean": round(statistics.mean(values) * 1000, 2),
                },
                "cpu_s_per_1000_tokens": {
                    k: round(v / max(tokens[name], 1) * 1000, 4) for k, v in cpu[name].items()
                },
            }
            if name != "direct":
                row["added_ttft_ms"] = {
                    "p50": round((pct(values, 0.5) - pct(direct, 0.5)) * 1000, 2),
                    "p99": round((pct(values, 0.99) - pct(direct, 0.99)) * 1000, 2),
                }
                row["gateway_cpu_ms_per_request"] = round(cpu[name]["server"] / max(len(values), 1) * 1000, 3)
            out[name] = row
        return out
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        with psycopg.connect(admin_url, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--serve-fake", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--token-interval-ms", type=float, default=20.0, help="0 = burst (saturation test)")
    parser.add_argument("--workers", default="1,2", help="gateway worker counts, compared side by side")
    parser.add_argument("--baseline-tree", default="", help="also run the gateway from this source tree")
    parser.add_argument("--pg-pool-max", type=int, default=6, help="per gateway process")
    parser.add_argument("--gateway-logs", action="store_true", help="show the gateways' stderr")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/9")
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C, so the child processes and the database are cleaned up.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        if args.serve_fake is not None:
            runner.run(serve_fake(args.serve_fake, args.tokens, args.token_interval_ms))
            return
        print(json.dumps(runner.run(bench(args)), indent=2))


if __name__ == "__main__":
    main()
