"""Latency and client CPU of one ledger settle (`PgLedger.settle`) against the local PostgreSQL.

    .venv/bin/python -m tools.bench settle [--n 600] [--label after]
    PYTHONPATH=/path/to/other/tree:. .venv/bin/python -m tools.bench settle --label before   # another source tree

Method: a fresh database (migrated), one team with credits, `--n` reservations made first; then the same number
of settles one after another (no concurrency, so the number is the round-trip cost of one settle); reported p50/p90
wall time per settle and this process's user+system CPU per settle (getrusage). Compare two trees by running the
tool from each, alternately, in one session.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Sequence

from psycopg_pool import AsyncConnectionPool

from apps.core.db.migrate import migrate_sync
from apps.core.ledger.pg import PgLedger
from apps.core.ledger.teams import TeamStore
from apps.core.spec import Prices
from tools.bench.common import admin_pg_url, fresh_database, pct, self_cpu_seconds


async def _settle_times(url: str, n: int) -> tuple[list[float], float]:
    """Per-settle wall times and this process's CPU seconds over all of them."""
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
        cpu0 = self_cpu_seconds()
        for rid in ids:
            start = time.perf_counter()
            await ledger.settle(rid, 5, 5)
            times.append(time.perf_counter() - start)
        return times, self_cpu_seconds() - cpu0


async def run(admin_url: str, n: int, label: str) -> None:
    with fresh_database(admin_url, "llmfleet_settle") as url:
        migrate_sync(url)
        times, cpu_s = await _settle_times(url, n)
    print(
        f"{label}: {n} settles, p50 {pct(times, 0.5) * 1000:.3f} ms, p90 {pct(times, 0.9) * 1000:.3f} ms, "
        f"client CPU {cpu_s / n * 1000:.3f} ms per settle"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=600)
    parser.add_argument("--label", default="this tree")
    parser.add_argument("--pg", default=admin_pg_url())
    args = parser.parse_args(argv)
    asyncio.run(run(args.pg, args.n, args.label))


if __name__ == "__main__":
    main()
