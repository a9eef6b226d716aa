"""Latency and client CPU of one ledger settle (`PgLedger.settle`) against the local PostgreSQL.

    .venv/bin/python tools/bench_settle.py [--n 600] [--label after]
    PYTHONPATH=/path/to/other/tree .venv/bin/python tools/bench_settle.py --label before   # another source tree

Method: a fresh database (migrated), one team with credits, `--n` reservations made first; then the same number
of settles one after another (no concurrency, so the number is the round-trip cost of one settle); reported p50/p90
wall time per settle and this process's user+system CPU per settle (getrusage). Compare two trees by running the
tool from each, alternately, in one session.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time
import uuid

import psycopg
from psycopg_pool import AsyncConnectionPool

from apps.core.db.migrate import migrate_sync
from apps.core.ledger.pg import PgLedger
from apps.core.ledger.teams import TeamStore
from apps.core.spec import Prices


async def run(admin_url: str, n: int, label: str) -> None:
    db = f"llmfleet_settle_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    url = admin_url.rsplit("/", 1)[0] + "/" + db
    try:
        migrate_sync(url)
        async with AsyncConnectionPool(url, min_size=2, max_size=4) as pool:
            prices = Prices(prompt_per_million_microcredits=3, completion_per_million_microcredits=7)
            ledger = PgLedger(pool, {"m": prices})
            team = await TeamStore(pool).create_team("bench")
            await TeamStore(pool).add_credits(team.id, 10**12)
            ids = [uuid.uuid4().hex for _ in range(n)]
            for rid in ids:
                await ledger.reserve(
                    request_id=rid,
                    team_id=team.id,
                    key_id=None,
                    model="m",
                    estimated_prompt_tokens=10,
                    max_tokens=10,
                )
            times: list[float] = []
            before = resource.getrusage(resource.RUSAGE_SELF)
            for rid in ids:
                start = time.perf_counter()
                await ledger.settle(rid, 5, 5)
                times.append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_SELF)
        cpu_ms = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / n * 1000
        times.sort()
        print(
            f"{label}: {n} settles, p50 {times[n // 2] * 1000:.3f} ms, p90 {times[int(n * 0.9)] * 1000:.3f} ms, "
            f"client CPU {cpu_ms:.3f} ms per settle"
        )
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=600)
    parser.add_argument("--label", default="this tree")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    asyncio.run(run(args.pg, args.n, args.label))


if __name__ == "__main__":
    main()
