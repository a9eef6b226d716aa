"""Console benchmark: a year of usage (1,000,000 ledger rows) rendered from the rollup.

    .venv/bin/python tools/bench/console.py [--rows 1000000] [--pg-url URL] [--repeat 20]

Creates a scratch database, applies the migrations, and writes `--rows` ledger rows for one
team spread over the last 365 days (3 models, 5 keys). The rows are inserted `reserved` and
then settled by UPDATE, so `usage_daily` is built by the settle trigger itself (the path
production uses). Then, in alternating runs inside one process:

  page  GET /console/team?from=<a year ago>&to=<today> through the real gateway app
        (in-process ASGI, real PostgreSQL): every query of the page, templates included;
  raw   the same year grouped per day and model from the raw ledger (`TeamStore.usage`,
        the JSON endpoint's function), which is what a page without rollups would run.

It also times settles with the rollup trigger on and off (alternating blocks of 500) to
show what the rollup costs the request path. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg

from apps.core.db.migrate import migrate_sync
from apps.core.identity.local_issuer import LocalIssuer
from apps.gateway.app import create_app
from apps.gateway.settings import GatewaySettings
from apps.gateway.wiring import build_deps

MODELS = ("llama-3.1-8b-instruct", "qwen2.5-32b-instruct", "llama-3.3-70b-instruct-fp8")

_FILL = """
INSERT INTO usage_ledger (request_id, team_id, key_id, model, prompt_price_per_million,
    completion_price_per_million, estimated_cost_microcredits, prompt_tokens, completion_tokens,
    cost_microcredits, created_at)
SELECT 'bench-' || g, %(team)s, (%(keys)s::bigint[])[1 + g %% 5], (%(models)s::text[])[1 + g %% 3], 100000, 300000, 10,
       0, 0, 0, %(now)s - make_interval(secs => (g::double precision * %(span)s / %(rows)s))
FROM generate_series(%(lo)s, %(hi)s - 1) AS g
"""
_SETTLE_ALL = """
UPDATE usage_ledger SET status = 'settled', prompt_tokens = 200 + id %% 50, completion_tokens = 100 + id %% 30,
       cost_microcredits = 50 + id %% 7, finalized_at = created_at + interval '2 seconds'
WHERE team_id = %s AND status = 'reserved' AND id BETWEEN %s AND %s
"""


def scratch_db(admin_url: str) -> tuple[str, str]:
    name = f"llmfleet_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    return name, admin_url.rsplit("/", 1)[0] + "/" + name


def fill(url: str, rows: int, now: datetime) -> tuple[int, list[int], float]:
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        team = conn.execute(
            "INSERT INTO teams (name, balance_microcredits) VALUES ('bench', 10^15) RETURNING id"
        ).fetchone()
        assert team is not None
        keys = [
            int(r[0])
            for r in conn.execute(
                "INSERT INTO api_keys (team_id, hash, prefix) SELECT %s, 'h' || g, 'sk-lf-bench' "
                "FROM generate_series(1, 5) g RETURNING id",
                (team[0],),
            ).fetchall()
        ]
        step = 100_000
        for lo in range(0, rows, step):
            params = {
                "team": team[0], "keys": keys, "models": list(MODELS), "now": now,
                "span": 365 * 86400, "rows": rows, "lo": lo, "hi": min(rows, lo + step),
            }  # fmt: skip
            conn.execute(_FILL.encode(), params)
        ids = conn.execute("SELECT min(id), max(id) FROM usage_ledger").fetchone()
        assert ids is not None
        for lo in range(int(ids[0]), int(ids[1]) + 1, step):
            conn.execute(_SETTLE_ALL.encode(), (team[0], lo, lo + step - 1))
        conn.execute("VACUUM ANALYZE usage_ledger")
        conn.execute("VACUUM ANALYZE usage_daily")
        counts = conn.execute(
            "SELECT (SELECT count(*) FROM usage_ledger), (SELECT count(*) FROM usage_daily)"
        ).fetchone()
        assert counts is not None
        assert int(counts[0]) == rows
    return int(team[0]), keys, time.perf_counter() - started


def settle_cost(url: str, team: int, blocks: int = 6, per_block: int = 500) -> dict[str, float]:
    """Microseconds per single-row settle UPDATE, trigger on vs off, alternating blocks."""
    times: dict[str, list[float]] = {"trigger_on": [], "trigger_off": []}
    with psycopg.connect(url, autocommit=True) as conn:
        for block in range(blocks):
            mode = "trigger_on" if block % 2 == 0 else "trigger_off"
            conn.execute(
                f"ALTER TABLE usage_ledger {'ENABLE' if mode == 'trigger_on' else 'DISABLE'} TRIGGER usage_daily_settle"
            )
            rids = [f"s-{block}-{i}-{uuid.uuid4().hex[:6]}" for i in range(per_block)]
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO usage_ledger (request_id, team_id, model, prompt_price_per_million, "
                    "completion_price_per_million, estimated_cost_microcredits) VALUES (%s, %s, %s, 1, 1, 1)",
                    [(rid, team, MODELS[0]) for rid in rids],
                )
            started = time.perf_counter()
            for rid in rids:
                conn.execute(
                    "UPDATE usage_ledger SET status = 'settled', prompt_tokens = 10, completion_tokens = 5, "
                    "cost_microcredits = 1 WHERE request_id = %s AND status = 'reserved'",
                    (rid,),
                )
            times[mode].append((time.perf_counter() - started) / per_block * 1e6)
        conn.execute("ALTER TABLE usage_ledger ENABLE TRIGGER usage_daily_settle")
    return {k: round(statistics.median(v), 1) for k, v in times.items()}


def _summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 1),
        "p95_ms": round(ordered[max(0, int(len(ordered) * 0.95) - 1)] * 1000, 1),
        "max_ms": round(ordered[-1] * 1000, 1),
    }


async def signin(c: httpx.AsyncClient, token: str) -> httpx.Response:
    """Sign in as a browser does (`apps/gateway/console/signin.py`): load the form, which sets its
    pre-session cookie and carries the matching `signin_csrf` token, then post the token through it."""
    form = await c.get("/console/signin")
    found = re.search(r'name="signin_csrf" value="([^"]+)"', form.text)
    if form.status_code != 200 or found is None:
        raise RuntimeError(f"no sign-in form at /console/signin ({form.status_code})")
    return await c.post("/console/signin", data={"token": token, "signin_csrf": found.group(1)})


async def render(url: str, team: int, repeat: int, now: datetime) -> dict[str, Any]:
    issuer = LocalIssuer.generate()
    jwks = issuer.serve()
    settings = GatewaySettings(
        database_url=url, secret_key="bench-secret", jwks_url=jwks,
        jwt_issuer=issuer.issuer, jwt_audience=issuer.audience, pg_pool_min=1, pg_pool_max=4,
    )  # fmt: skip
    deps = await build_deps(settings)
    app = create_app(settings, deps)
    start, end = (now - timedelta(days=364)).date(), now.date()
    page: list[float] = []
    raw: list[float] = []
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
            r = await signin(c, issuer.mint("bench-user", team="bench"))
            assert r.status_code == 303, r.text
            path = f"/console/team?from={start}&to={end}"
            teams = deps.teams  # the JSON endpoint's raw-ledger function, same pool
            html_bytes = 0
            for i in range(repeat * 2 + 2):
                t0 = time.perf_counter()
                if i % 2 == 0:
                    r = await c.get(path)
                    assert r.status_code == 200, r.text[:500]
                    assert "No usage in this range" not in r.text
                    html_bytes = len(r.content)
                else:
                    rows = await teams.usage(
                        team, datetime.combine(start, datetime.min.time(), UTC),
                        datetime.combine(end + timedelta(days=1), datetime.min.time(), UTC), by_day=True,
                    )  # fmt: skip
                    assert rows
                elapsed = time.perf_counter() - t0
                if i >= 2:  # the first pair warms the pools and caches
                    (page if i % 2 == 0 else raw).append(elapsed)
    finally:
        for close in deps.closers:
            await close()
        issuer.stop()
    return {
        "page_full_year": _summary(page),
        "raw_ledger_query_full_year": _summary(raw),
        "page_bytes": html_bytes,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="console: the full-year team page on N ledger rows")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    args = parser.parse_args(argv)
    name, url = scratch_db(args.pg_url)
    now = datetime.now(UTC)
    try:
        migrate_sync(url)
        team, _keys, fill_s = fill(url, args.rows, now)
        with psycopg.connect(url) as conn:
            rollup_rows = conn.execute("SELECT count(*) FROM usage_daily").fetchone()
        result = asyncio.run(render(url, team, args.repeat, now))
        result.update(
            rows=args.rows,
            rollup_rows=int(rollup_rows[0]) if rollup_rows else 0,
            fill_and_settle_s=round(fill_s, 1),
            settle_us_per_row=settle_cost(url, team),
        )
        print(json.dumps(result, indent=2))
    finally:
        if not args.keep:
            with psycopg.connect(args.pg_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


if __name__ == "__main__":
    main()
