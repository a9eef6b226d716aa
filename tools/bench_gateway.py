"""Gateway overhead benchmark: loadgen -> gateway -> fake zero-latency orchestrator, versus
loadgen -> the same fake directly, side by side in one run.

    .venv/bin/python tools/bench_gateway.py [--streams 200] [--rounds 3] [--requests 5] [--tokens 64]

What runs (all on loopback, separate processes so CPU is attributable):
  * the fake orchestrator (this script with `--serve-fake PORT`, aiohttp): answers both
    `POST /internal/v1/dispatch` and `POST /v1/chat/completions` with a vLLM-like SSE stream of
    `--tokens` chunks written back to back (zero latency);
  * `llmfleet gateway` (uvicorn, one process) against real PostgreSQL and Redis (a fresh,
    migrated database; a team with credits; one key without quotas);
  * the load generator (this process, aiohttp): `--streams` concurrent clients, each issuing
    `--requests` streaming requests in sequence, alternating direct and gateway rounds.

Reported: TTFT (request sent -> first content chunk received) p50/p99 per mode, the added TTFT
(gateway - direct), and the gateway's CPU seconds (utime+stime from /proc) per 1,000 relayed
tokens. Each chunk is one token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
MODEL = "llama-3.1-8b-instruct"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- fake orchestrator
async def serve_fake(port: int, tokens: int, interval_ms: float) -> None:
    from aiohttp import web

    def chunk(rid: str, delta: dict[str, object], finish: str | None = None) -> bytes:
        obj = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": 0,
            "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"

    async def stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        rid = uuid.uuid4().hex
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(chunk(rid, {"role": "assistant", "content": ""}))
        for i in range(tokens):
            if interval_ms and i:
                await asyncio.sleep(interval_ms / 1000)  # decode pacing after a zero-latency first token
            await resp.write(chunk(rid, {"content": f"t{i} "}))
        await resp.write(chunk(rid, {}, "stop") + b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/internal/v1/dispatch", stream)
    app.router.add_post("/v1/chat/completions", stream)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=2048).start()
    await asyncio.Event().wait()


# ---------------------------------------------------------------- load generator
async def one_round(
    url: str, key: str, streams: int, requests: int, stagger_s: float = 0.0
) -> tuple[list[float], int, int]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "bench"}],
        "max_tokens": 64,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {key}"}
    ttfts: list[float] = []
    errors = 0
    chunks = 0
    conn = aiohttp.TCPConnector(limit=streams + 10)
    async with aiohttp.ClientSession(connector=conn) as session:

        async def client(i: int) -> None:
            nonlocal errors, chunks
            # Spread the clients' start over one request duration so arrivals are steady, not one burst.
            await asyncio.sleep(stagger_s * i / streams)
            for _ in range(requests):
                t0 = time.perf_counter()
                async with session.post(url, json=body, headers=headers) as resp:
                    if resp.status != 200:
                        errors += 1
                        await resp.read()
                        continue
                    first = True
                    async for line in resp.content:
                        if line.startswith(b"data: {") and b'"content":"t' in line:
                            chunks += 1
                            if first:
                                ttfts.append(time.perf_counter() - t0)
                                first = False

        await asyncio.gather(*(client(i) for i in range(streams)))
    return ttfts, errors, chunks


def spawn(cmd: list[str], env: dict[str, str] | None = None, quiet: bool = False) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL if quiet else None)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def wait_http(url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as s:
        while True:
            try:
                async with s.get(url) as r:
                    if r.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not come up")
            await asyncio.sleep(0.1)


async def bench(args: argparse.Namespace) -> dict[str, object]:
    import psycopg
    from psycopg_pool import AsyncConnectionPool

    from apps.core.db.migrate import migrate_sync
    from apps.core.identity.keys import KeyStore
    from apps.core.ledger.teams import TeamStore

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
        fake_port, gw_port = free_port(), free_port()
        procs.append(
            spawn(
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
        )
        env = {
            **os.environ,
            "LLMFLEET_DATABASE_URL": db_url,
            "LLMFLEET_REDIS_URL": args.redis,
            "LLMFLEET_ORCHESTRATOR_URL": f"http://127.0.0.1:{fake_port}",
            "LLMFLEET_SECRET_KEY": secret,
            "LLMFLEET_INTERNAL_TOKEN": "bench",
            "LLMFLEET_STACK": "dev",
        }
        gw = spawn([str(ROOT / ".venv/bin/llmfleet"), "gateway", "--port", str(gw_port)], env=env, quiet=True)
        procs.append(gw)
        await wait_http(f"http://127.0.0.1:{gw_port}/livez")
        await wait_http(f"http://127.0.0.1:{fake_port}/v1/chat/completions")
        direct_url = f"http://127.0.0.1:{fake_port}/v1/chat/completions"
        gw_url = f"http://127.0.0.1:{gw_port}/v1/chat/completions"
        await one_round(gw_url, key, 20, 2)  # warm-up: connection pools, key cache
        stagger = args.tokens * args.token_interval_ms / 1000
        results: dict[str, list[float]] = {"direct": [], "gateway": []}
        errors = {"direct": 0, "gateway": 0}
        gw_cpu = 0.0
        gw_tokens = 0
        for _ in range(args.rounds):
            ttfts, err, _chunks = await one_round(direct_url, key, args.streams, args.requests, stagger)
            results["direct"] += ttfts
            errors["direct"] += err
            before = cpu_seconds(gw.pid)
            ttfts, err, chunks = await one_round(gw_url, key, args.streams, args.requests, stagger)
            gw_cpu += cpu_seconds(gw.pid) - before
            gw_tokens += chunks
            results["gateway"] += ttfts
            errors["gateway"] += err
        out: dict[str, object] = {
            "streams": args.streams,
            "tokens_per_request": args.tokens,
            "token_interval_ms": args.token_interval_ms,
            "requests": {k: len(v) for k, v in results.items()},
            "errors": errors,
        }
        for mode, values in results.items():
            out[f"{mode}_ttft_ms"] = {
                "p50": round(pct(values, 0.5) * 1000, 2),
                "p99": round(pct(values, 0.99) * 1000, 2),
                "mean": round(statistics.mean(values) * 1000, 2),
            }
        d, g = out["direct_ttft_ms"], out["gateway_ttft_ms"]
        assert isinstance(d, dict)
        assert isinstance(g, dict)
        out["added_ttft_ms"] = {"p50": round(g["p50"] - d["p50"], 2), "p99": round(g["p99"] - d["p99"], 2)}
        out["gateway_cpu_s_per_1000_tokens"] = round(gw_cpu / max(gw_tokens, 1) * 1000, 4)
        out["gateway_cpu_s_per_request"] = round(gw_cpu / max(len(results["gateway"]), 1), 5)
        return out
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        with psycopg.connect(admin_url, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--serve-fake", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--token-interval-ms", type=float, default=20.0, help="0 = burst (saturation test)")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/9")
    args = parser.parse_args()
    if args.serve_fake is not None:
        asyncio.run(serve_fake(args.serve_fake, args.tokens, args.token_interval_ms))
        return
    print(json.dumps(asyncio.run(bench(args)), indent=2))


if __name__ == "__main__":
    main()
