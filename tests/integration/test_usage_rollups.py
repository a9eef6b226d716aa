"""`usage_daily` against the raw ledger: same totals for any whole-day range, over random ledgers."""

from __future__ import annotations

import random
import shutil
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from psycopg_pool import AsyncConnectionPool

from apps.core.db.migrate import MIGRATIONS_DIR, migrate_sync
from apps.core.identity.keys import KeyStore
from apps.core.ledger.pg import PgLedger
from apps.core.ledger.rollups import CacheUse, DailyUsage, UsageRollups
from apps.core.ledger.teams import TeamStore
from apps.core.spec import load_spec
from tests.fleet import EMBED_MODEL

DAY0 = date(2026, 1, 1)
SPAN_DAYS = 40


@pytest.fixture
async def pool(migrated_db_url: str) -> AsyncIterator[AsyncConnectionPool]:
    async with AsyncConnectionPool(migrated_db_url, min_size=1, max_size=4, kwargs={"autocommit": True}) as p:
        yield p


def _ledger(pool: AsyncConnectionPool) -> PgLedger:
    spec = load_spec("dev")
    return PgLedger(pool, {n: m.prices for n, m in spec.models.items()})


async def _random_ledger(pool: AsyncConnectionPool, rng: random.Random, rows: int) -> list[int]:
    """Teams with keys; rows reserved, back-dated, then settled, cancelled or left open. Some are the
    response cache's (0017): hits, misses, and semantic lookups (`<id>:cache-embed` on the embedding model)."""
    teams, keys = TeamStore(pool), KeyStore(pool, b"k")
    ledger = _ledger(pool)
    models = list(load_spec("dev").models)
    team_keys: dict[int, list[int | None]] = {}
    for _ in range(3):
        team = await teams.create_team(f"t-{uuid.uuid4().hex[:8]}")
        await teams.add_credits(team.id, 10**15)
        team_keys[team.id] = [None] + [(await keys.create(team=team.id))[1].id for _ in range(2)]
    for _ in range(rows):
        team_id = rng.choice(list(team_keys))
        cache = rng.choice([None, None, "hit", "miss", "lookup"])
        rid = uuid.uuid4().hex + (":cache-embed" if cache == "lookup" else "")
        await ledger.reserve(
            request_id=rid, team_id=team_id, key_id=rng.choice(team_keys[team_id]),
            model=EMBED_MODEL if cache == "lookup" else rng.choice(models),
            estimated_prompt_tokens=rng.randint(1, 50), max_tokens=rng.randint(1, 50),
            **({"cache": cache} if cache in ("hit", "miss") else {}),
        )  # fmt: skip
        # Near day boundaries on purpose: a second before/after UTC midnight.
        at = datetime.combine(DAY0, datetime.min.time(), UTC) + timedelta(
            days=rng.randrange(SPAN_DAYS), seconds=rng.choice([0, 1, 43_200, 86_399])
        )
        async with pool.connection() as conn:
            await conn.execute("UPDATE usage_ledger SET created_at = %s WHERE request_id = %s", (at, rid))
        fate = rng.random()
        if fate < 0.75:
            prompt = rng.randint(0, 4000)
            await ledger.settle(
                rid, prompt, rng.randint(0, 4000), cached_prompt_tokens=rng.randint(0, prompt)
            )
            if rng.random() < 0.1:  # a retried settle must not count twice
                await ledger.settle(rid, 1, 1)
        elif fate < 0.9:
            await ledger.cancel(rid)
    return list(team_keys)


async def _raw(
    pool: AsyncConnectionPool, team_id: int, start: date, end: date
) -> dict[tuple[str, str, int], list[int]]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD'), model, COALESCE(key_id, 0), count(*), "
            "SUM(prompt_tokens), SUM(completion_tokens), SUM(cost_microcredits), SUM(cached_prompt_tokens) "
            "FROM usage_ledger "
            "WHERE team_id = %s AND status = 'settled' AND created_at >= %s AND created_at < %s GROUP BY 1, 2, 3",
            (
                team_id,
                datetime.combine(start, datetime.min.time(), UTC),
                datetime.combine(end, datetime.min.time(), UTC),
            ),
        )
        return {(r[0], r[1], int(r[2])): [int(x) for x in r[3:]] for r in await cur.fetchall()}


def _fold(raw: dict[tuple[str, str, int], list[int]], key_id: int | None) -> dict[tuple[str, str], list[int]]:
    out: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for (day, model, key), values in raw.items():
        if key_id is None or key == key_id:
            out[(day, model)] = [a + b for a, b in zip(out[(day, model)], values, strict=True)]
    return dict(out)


def _rolled(rows: list[DailyUsage]) -> dict[tuple[str, str], list[int]]:
    return {
        (r.day.isoformat(), r.model): [
            r.requests,
            r.prompt_tokens,
            r.completion_tokens,
            r.cost_microcredits,
            r.cached_prompt_tokens,
        ]
        for r in rows
    }


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_rollup_equals_the_raw_ledger_for_random_ranges(pool: AsyncConnectionPool, seed: int) -> None:
    rng = random.Random(seed)
    team_ids = await _random_ledger(pool, rng, 150)
    rollups, teams = UsageRollups(pool), TeamStore(pool)
    for _ in range(12):
        team_id = rng.choice(team_ids)
        a, b = sorted(rng.sample(range(SPAN_DAYS + 2), 2))
        start, end = DAY0 + timedelta(days=a - 1), DAY0 + timedelta(days=b)
        raw = await _raw(pool, team_id, start, end)
        key_id = rng.choice([None, *{k for (_, _, k) in raw}])
        got = _rolled(await rollups.daily(team_id, start, end, key_id=key_id))
        assert got == _fold(raw, key_id)
        # The JSON endpoint's function (`/v1/usage?group_by=day`) agrees too.
        json_rows = await teams.usage(
            team_id, datetime.combine(start, datetime.min.time(), UTC),
            datetime.combine(end, datetime.min.time(), UTC), by_day=True,
        )  # fmt: skip
        assert sum(r["cost_microcredits"] for r in json_rows) == sum(v[3] for v in _fold(raw, None).values())


async def test_money_invariant_holds_through_the_rollup(pool: AsyncConnectionPool) -> None:
    team_ids = await _random_ledger(pool, random.Random(7), 80)
    async with pool.connection() as conn:
        for team_id in team_ids:
            cur = await conn.execute(
                "SELECT (SELECT SUM(amount_microcredits) FROM credit_entries WHERE team_id = %s) - balance_microcredits, "
                "(SELECT COALESCE(SUM(cost_microcredits), 0) FROM usage_daily WHERE team_id = %s) FROM teams WHERE id = %s",
                (team_id, team_id, team_id),
            )
            spent, rolled = await cur.fetchone()  # type: ignore[misc]
            assert spent == rolled


async def test_migration_backfills_rows_settled_before_it(fresh_db_url: str, tmp_path: Path) -> None:
    before = tmp_path / "before"
    before.mkdir()
    for path in MIGRATIONS_DIR.glob("*.sql"):
        # Every migration but the rollups' own (0005, and 0012 and 0018 which extend its table): today's
        # code writes the rows, and it needs the columns of the later migrations (0006's key caps and quota
        # subject, 0011's cached tokens and 0017's cache use on the ledger).
        if not path.name.startswith(("0005", "0012", "0018")):
            shutil.copy(path, before / path.name)
    migrate_sync(fresh_db_url, before)
    async with AsyncConnectionPool(fresh_db_url, min_size=1, max_size=2, kwargs={"autocommit": True}) as p:
        team_ids = await _random_ledger(p, random.Random(11), 60)
    assert "0005_usage_daily.sql" in migrate_sync(fresh_db_url)
    async with AsyncConnectionPool(fresh_db_url, min_size=1, max_size=2, kwargs={"autocommit": True}) as p:
        for team_id in team_ids:
            start, end = DAY0, DAY0 + timedelta(days=SPAN_DAYS)
            raw = _fold(await _raw(p, team_id, start, end), None)
            got = _rolled(await UsageRollups(p).daily(team_id, start, end))
            assert got == raw
            # 0018's backfill: the cache's rows settled before it.
            assert await UsageRollups(p).cache_use(team_id, start, end) == await _raw_cache(
                p, team_id, start, end, None
            )


# The response cache's part of the rollup (migration 0018: the console's cache panel).


async def _raw_cache(
    pool: AsyncConnectionPool, team_id: int, start: date, end: date, key_id: int | None
) -> list[CacheUse]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT team_id, model, count(*) FILTER (WHERE cache = 'hit'), count(*) FILTER (WHERE cache = 'miss'),"
            " COALESCE(SUM(completion_tokens) FILTER (WHERE cache = 'hit'), 0),"
            " COALESCE(SUM(cost_microcredits) FILTER (WHERE cache = 'hit'), 0),"
            " count(*) FILTER (WHERE request_id LIKE '%%:cache-embed'),"
            " COALESCE(SUM(cost_microcredits) FILTER (WHERE request_id LIKE '%%:cache-embed'), 0)"
            " FROM usage_ledger WHERE team_id = %s AND status = 'settled' AND created_at >= %s AND created_at < %s"
            " AND (cache IS NOT NULL OR request_id LIKE '%%:cache-embed')"
            " AND (%s::bigint IS NULL OR key_id IS NOT DISTINCT FROM NULLIF(%s::bigint, 0))"
            " GROUP BY 1, 2 ORDER BY 1, 2",
            (
                team_id,
                datetime.combine(start, datetime.min.time(), UTC),
                datetime.combine(end, datetime.min.time(), UTC),
                key_id,
                key_id,
            ),
        )
        return [CacheUse(int(r[0]), str(r[1]), *(int(v) for v in r[2:])) for r in await cur.fetchall()]


@pytest.mark.parametrize("seed", [1, 2])
async def test_the_cache_rollup_equals_the_raw_ledger_and_0018_applies_twice(
    pool: AsyncConnectionPool, seed: int
) -> None:
    rng = random.Random(seed)
    team_ids = await _random_ledger(pool, rng, 160)
    rollups = UsageRollups(pool)

    async def check() -> None:
        for _ in range(10):
            team_id = rng.choice(team_ids)
            a, b = sorted(rng.sample(range(SPAN_DAYS + 2), 2))
            start, end = DAY0 + timedelta(days=a - 1), DAY0 + timedelta(days=b)
            key_id = rng.choice([None, 0, *(k.id for k in await KeyStore(pool, b"k").list_keys(team_id))])
            got = await rollups.cache_use(team_id, start, end, key_id=key_id)
            assert got == await _raw_cache(pool, team_id, start, end, key_id)
        whole = await rollups.cache_use(None, DAY0, DAY0 + timedelta(days=SPAN_DAYS))
        assert {r.team_id for r in whole} == set(team_ids)
        assert sum(r.hits for r in whole) > 0
        assert sum(r.lookups for r in whole) > 0

    await check()
    # The columns at zero (as before 0018): applying the migration again, twice, brings back the same values.
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE usage_daily SET cache_hits = 0, cache_misses = 0, cache_hit_completion_tokens = 0,"
            " cache_hit_cost_microcredits = 0, cache_lookups = 0, cache_lookup_cost_microcredits = 0"
        )
        assert await rollups.cache_use(None, DAY0, DAY0 + timedelta(days=SPAN_DAYS)) == []
        for _ in range(2):
            await conn.execute(
                (MIGRATIONS_DIR / "0018_usage_daily_cache.sql").read_text(encoding="utf-8").encode()
            )
    await check()
