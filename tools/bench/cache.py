"""The response cache (docs/response-cache.md): a hit vs the same request's miss, and what the lookup adds
to a miss, side by side in one run on one platform.

  .venv/bin/python -m tools.bench cache [--requests 60] [--max-tokens 16] [--warmup 3] [--out FILE]

One local platform (`apps.cli.platform.LocalPlatform`: one gateway, one orchestrator, an enginesim 8B
chat node and an enginesim bge-m3 embedding node, each with its agent; real Redis; real PostgreSQL with
pgvector: the configured server when it has the `vector` extension, else an embedded pgserver started for
the run, as the tests' `vector_pg_admin_url` fixture does). Four teams, each with a key without quotas:

  off, off_b  no cache policy (the cache is not asked): the reference, and a second identical team whose
              difference from the first is the noise of the comparison (an A/A arm);
  exact       the model cached, exact matches only (one PostgreSQL query per lookup);
  semantic    the model cached with `semantic_threshold` (0.9) and `embedding_model` bge-m3: an exact
              query, then the question's embedding through the fleet and a pgvector cosine query.

Each round n sends one new streaming chat request (a system prompt, a question of unique words, greedy,
`max_tokens` N with `ignore_eos`) from each of the four teams, in a fresh seeded random order, one request
at a time (no concurrency: the lookup's own latency, not queueing). Every one is a miss served by the
engine. Then, in a random order: `exact_hit`, the exact team's same request again (answered by the
gateway from the entry), and `semantic_hit`, the semantic team's request with the question reworded
(the same words in lower case without punctuation: no exact match, cosine about 0.94 on enginesim's
bag-of-words vectors), answered from the entry after the embedding and the vector query. The first
`--warmup` rounds are not counted. Every answer must carry the expected `x-llmfleet-cache` header (none,
`miss`, `hit`), else it is left out and counted.

Times are the client's (a raw keep-alive HTTP/1.1 connection per arm, `time.perf_counter`, from the
request's write): first byte of the response, first content token, last byte (the whole answer). After
each request (and, for a caching miss, once its entry is in the table) the client idles `--gap-ms`
(60 ms): the request's tail ends in its own window, and every request finds the engines idle for more
than 50 ms (enginesim counts a shorter idle time as simulated time still owed and runs the next steps
early, which would make the engine's time depend on the order of the arms). CPU per request is the
gateway's (and the platform's: gateway + orchestrator + agents) kernel run time over that window.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
from psycopg_pool import AsyncConnectionPool

from apps.cli.platform import MODEL_8B, MODEL_EMBED, LocalPlatform, NodeSpec, PlatformConfig
from apps.core.embedded import EmbeddedPostgres
from apps.core.identity.keys import KeyStore
from apps.core.ledger.teams import TeamStore
from tools.bench.cache_client import Answer, Client, CpuClock
from tools.bench.cache_report import HITS, MISSES, Arm, Run, render
from tools.bench.common import (
    DEFAULT_REDIS,
    admin_pg_url,
    fresh_database,
    loop_factory,
    machine,
    publish,
    tree_cpu_seconds,
)

SYSTEM = "You are the support assistant of a small shop. Answer briefly."


def arms() -> dict[str, Arm]:
    return {
        "off": Arm("off", "off", "", False, "cache off for the team: no lookup (the reference)"),
        "off_b": Arm("off_b", "off_b", "", False, "a second cache-off team (A/A: the noise)"),
        "exact": Arm("exact", "exact", "miss", True, "exact lookup (one PostgreSQL query), miss, stored"),
        "semantic": Arm(
            "semantic", "semantic", "miss", True, "exact lookup, embedding, pgvector query; miss, stored"
        ),
        "exact_hit": Arm("exact_hit", "exact", "hit", False, "the exact arm's request again: a hit"),
        "semantic_hit": Arm(
            "semantic_hit", "semantic", "hit", False, "the semantic arm's question reworded: a semantic hit"
        ),
    }


def question(tag: str, n: int) -> str:
    """Round n's question: words no other round shares (no semantic match across rounds)."""
    words = " ".join(f"{tag}w{n}x{j}" for j in range(12))
    return f"Question {n}: is {words} in stock?"


def reworded(text: str) -> str:
    """The same words, lower case, no punctuation: never an exact match, close on a bag of words."""
    return "".join(c for c in text.lower() if c.isalnum() or c == " ")


def body(text: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL_8B,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }


def shuffled(names: Sequence[str], rng: random.Random) -> list[str]:
    """A round's order: a fresh permutation, so that every arm follows every other one alike (what the
    previous request left running, e.g. its settle, then weighs on no arm in particular)."""
    out = list(names)
    rng.shuffle(out)
    return out


# ---------------------------------------------------------------- the platform
def has_pgvector(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'").fetchone()
    return bool(row and row[0])


@contextmanager
def vector_server(admin_url: str, data_dir: Path) -> Iterator[tuple[str, str]]:
    """(admin URL, which server): `admin_url` when it has pgvector, else an embedded pgserver."""
    if has_pgvector(admin_url):
        yield admin_url, "the configured server"
        return
    embedded = EmbeddedPostgres(data_dir)
    try:
        yield embedded.start(), "an embedded pgserver (the configured server has no vector extension)"
    finally:
        embedded.stop()


def server_versions(db_url: str) -> str:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT current_setting('server_version'), (SELECT extversion FROM pg_extension WHERE extname = 'vector')"
        ).fetchone()
    assert row is not None
    return f"PostgreSQL {row[0]}, pgvector {row[1]}"


@contextmanager
def cache_platform(args: argparse.Namespace) -> Iterator[tuple[LocalPlatform, str]]:
    run = uuid.uuid4().hex[:6]
    with (
        tempfile.TemporaryDirectory(prefix="llmfleet-cachebench-") as tmp,
        vector_server(args.pg, Path(tmp) / "pg") as (server, which),
        fresh_database(server, "llmfleet_cachebench") as db_url,
    ):
        nodes = [
            NodeSpec(f"cache-8b-{run}", MODEL_8B, "cloud", engine_args=("--num-blocks", "400000")),
            NodeSpec(f"cache-embed-{run}", MODEL_EMBED, "cloud"),
        ]
        config = PlatformConfig(
            data_dir=Path(tmp) / "platform", gateway_port=0, nodes=nodes, database_url=db_url,
            redis_url=args.redis, speed=args.speed, ready_timeout_s=120,
            orchestrator_id_prefix=f"cachebench-{run}",
        )  # fmt: skip
        with LocalPlatform(config) as platform:
            yield platform, f"{server_versions(db_url)}, {which}"


async def _teams(platform: LocalPlatform) -> dict[str, tuple[int, str]]:
    """The four teams: id and a key without quotas each."""
    secret = platform.secrets["secret_key"].encode()
    out: dict[str, tuple[int, str]] = {}
    async with AsyncConnectionPool(platform.database_url, min_size=1, max_size=2) as pool:
        for name in MISSES:
            team = await TeamStore(pool).create_team(f"cachebench-{name}")
            await TeamStore(pool).add_credits(team.id, 10**15)
            key, _ = await KeyStore(pool, secret).create(team=team.id)
            out[name] = (team.id, key)
    return out


async def _policies(platform: LocalPlatform, teams: dict[str, tuple[int, str]], threshold: float) -> None:
    documents = {
        "exact": {"models": {MODEL_8B: {}}},
        "semantic": {"models": {MODEL_8B: {"semantic_threshold": threshold}}, "embedding_model": MODEL_EMBED},
    }
    headers = {"Authorization": f"Bearer {platform.admin_token}"}
    async with httpx.AsyncClient(base_url=platform.gateway_url, headers=headers, timeout=30) as admin:
        for name, document in documents.items():
            saved = await admin.put(f"/admin/teams/{teams[name][0]}/cache", json=document)
            if saved.status_code != 200:
                raise SystemExit(f"cache: the {name} team's policy was refused: {saved.text}")


def parse_metrics(text: str, label: str = "") -> dict[str, float]:
    """Every sample of a Prometheus text page, summed per name (and per value of `label`: "name|value")."""
    tag = re.compile(rf'(?:{label})="([^"]*)"') if label else None
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        name, _, labels = series.partition("{")
        found = tag.search(labels) if tag is not None else None
        key = f"{name}|{found.group(1)}" if found else name
        out[key] = out.get(key, 0.0) + float(value)
    return out


def scrape(base_url: str, label: str = "") -> dict[str, float]:
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as resp:  # loopback: our own servers
        return parse_metrics(resp.read().decode(), label)


def counters(platform: LocalPlatform) -> dict[str, dict[str, float]]:
    """The gateway's cache metrics (by match and result) and each engine's own, by model."""
    out = {"gateway": scrape(platform.gateway_url, "match|result")}
    out |= {engine.spec.model: scrape(engine.url) for engine in platform.engines.values()}
    return out


def since(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    return {s: {k: v - before[s].get(k, 0.0) for k, v in after[s].items()} for s in after}


# ---------------------------------------------------------------- the rounds
@dataclass
class Bench:
    arms: dict[str, Arm]
    clients: dict[str, Client]
    team_ids: dict[str, int]
    pool: AsyncConnectionPool
    gateway: CpuClock
    platform: CpuClock
    tag: str
    max_tokens: int
    gap_s: float
    entries: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MISSES, 0))
    order: random.Random = field(default_factory=lambda: random.Random(0))

    async def stored(self, team: str, timeout_s: float = 10.0) -> bool:
        """Wait until the team's entry of the last miss is in the table (stored after the response)."""
        want = self.entries[team]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            async with self.pool.connection() as conn:
                cur = await conn.execute(
                    "SELECT count(*) FROM response_cache WHERE team_id = %s", (self.team_ids[team],)
                )
                row = await cur.fetchone()
            if row is not None and int(row[0]) >= want:
                return True
            await asyncio.sleep(0.002)
        return False

    async def one(self, name: str, text: str, round_: int, measured: bool) -> Answer:
        arm = self.arms[name]
        client = self.clients[arm.team]
        await client.ready()
        raw = client.raw(body(text, self.max_tokens))
        gateway0, platform0 = self.gateway.seconds(), self.platform.seconds()
        answer = await client.send(raw)
        missed = arm.stores and answer.status == 200 and answer.cache == "miss"
        if missed:
            self.entries[arm.team] += 1
            if not await self.stored(arm.team):
                arm.not_stored += 1
                self.entries[arm.team] -= 1
        await asyncio.sleep(self.gap_s)  # the request's tail (settle, logs) ends in its own window
        gateway_s, platform_s = self.gateway.seconds() - gateway0, self.platform.seconds() - platform0
        if measured:
            arm.add(round_, answer, gateway_s, platform_s)
        return answer

    async def round(self, n: int, measured: bool) -> None:
        text = question(self.tag, n)
        for name in shuffled(MISSES, self.order):
            await self.one(name, text, n, measured)
        for name in shuffled(HITS, self.order):
            await self.one(name, text if name == "exact_hit" else reworded(text), n, measured)


async def run_rounds(platform: LocalPlatform, args: argparse.Namespace) -> Run:
    teams = await _teams(platform)
    await _policies(platform, teams, args.threshold)
    children = {c.name: psutil.Process(c.pid) for c in platform.supervisor.children}
    gateway = children["gateway"]
    relay = [p for name, p in children.items() if name.startswith(("orchestrator-", "agent-"))]
    port = int(platform.gateway_url.rsplit(":", 1)[1])
    async with AsyncConnectionPool(platform.database_url, min_size=1, max_size=2) as pool:
        bench = Bench(
            arms(), {name: Client(port, key) for name, (_, key) in teams.items()},
            {name: team for name, (team, _) in teams.items()}, pool, CpuClock([gateway]),
            CpuClock([gateway, *relay]), uuid.uuid4().hex[:4], args.max_tokens, args.gap_ms / 1000,
        )  # fmt: skip
        try:
            for n in range(args.warmup):
                await bench.round(n, measured=False)
            before, started = counters(platform), time.monotonic()
            cpu0 = (bench.gateway.seconds(), tree_cpu_seconds([gateway]))
            for n in range(args.warmup, args.warmup + args.requests):
                await bench.round(n, measured=True)
                if (n - args.warmup + 1) % 20 == 0:
                    print(f"cache: {n - args.warmup + 1}/{args.requests} rounds", flush=True)
            wall = time.monotonic() - started
            cpu = (bench.gateway.seconds() - cpu0[0], tree_cpu_seconds([gateway]) - cpu0[1])
            after = counters(platform)
        finally:
            for client in bench.clients.values():
                client.close()
    return Run(bench.arms, since(before, after), wall, bench.gateway.precise, cpu)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=60, help="counted rounds: requests per arm")
    parser.add_argument("--warmup", type=int, default=3, help="rounds not counted")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--gap-ms", type=float, default=60.0, help="idle time after each request, inside its CPU window"
    )
    parser.add_argument("--speed", type=float, default=1.0, help="enginesim's speed")
    parser.add_argument("--threshold", type=float, default=0.9, help="the semantic team's threshold")
    parser.add_argument("--pg", default=admin_pg_url(), help="PostgreSQL admin URL (pgvector or embedded)")
    parser.add_argument("--redis", default=os.environ.get("LLMFLEET_REDIS_URL", DEFAULT_REDIS))
    parser.add_argument("--out", type=Path, default=None, help="also write the page to this file")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.warmup < 0:
        parser.error("--requests must be at least 1 and --warmup at least 0")
    about = machine()
    with cache_platform(args) as (platform, database):
        about["postgresql"] = database
        about["redis"] = args.redis
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            run = runner.run(run_rounds(platform, args))
    publish(render(args, about, run), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
