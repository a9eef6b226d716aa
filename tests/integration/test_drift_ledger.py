"""The drift job's ledger side (`apps.ops.drift.ledger_tokens`) on a real ledger: the response cache's
hits are billed tokens no engine generated, so they are left out; its misses ran on an engine and count."""

from __future__ import annotations

import datetime as dt

from psycopg_pool import AsyncConnectionPool

from apps.core.ledger.pg import PgLedger
from apps.core.ledger.teams import TeamStore
from apps.core.spec import load_spec
from apps.ops.drift import ledger_tokens

MODEL = "llama-3.1-8b-instruct"


async def test_cache_hits_are_not_engine_tokens(migrated_db_url: str) -> None:
    start = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    async with AsyncConnectionPool(
        migrated_db_url, min_size=1, max_size=2, kwargs={"autocommit": True}
    ) as pool:
        team = await TeamStore(pool).create_team("drifty")
        await TeamStore(pool).add_credits(team.id, 10**12)
        ledger = PgLedger(pool, {n: m.prices for n, m in load_spec("dev").models.items()})
        for rid, cache, completion in (("plain", None, 100), ("miss", "miss", 20), ("hit", "hit", 7_000)):
            await ledger.reserve(
                request_id=rid, team_id=team.id, key_id=None, model=MODEL, estimated_prompt_tokens=10,
                max_tokens=completion, **({"cache": cache} if cache else {}),
            )  # fmt: skip
            await ledger.settle(rid, 10, completion)
    end = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=1)
    assert ledger_tokens(migrated_db_url, start, end, MODEL) == (120, 2)
    assert ledger_tokens(migrated_db_url, start, end, None) == (120, 2)
