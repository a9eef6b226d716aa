"""The admission Lua script against real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
import redis.asyncio as aioredis

from apps.core.quota.admission import Limits, QuotaStore, Verdict
from apps.gateway.settings import GatewaySettings


@pytest.fixture
async def rds(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_pool(aioredis.BlockingConnectionPool.from_url(redis_url, max_connections=50))
    yield client
    await client.aclose()


NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
LEASE_S = GatewaySettings().stream_lease_s


async def test_max_streams_exact_under_concurrency(rds: aioredis.Redis) -> None:
    q = QuotaStore(rds, lease_s=LEASE_S)
    results = await asyncio.gather(*(q.admit("k", f"r{i}", Limits(max_streams=5), NOW) for i in range(200)))
    assert sum(r.admitted for r in results) == 5
    refused = [r for r in results if not r.admitted]
    assert all(r.verdict is Verdict.MAX_STREAMS and r.retry_after_s >= 1 for r in refused)
    assert await rds.scard("streams:k") == 5
    admitted = [f"r{i}" for i, r in enumerate(results) if r.admitted]
    await q.release("k", admitted[0])
    await q.release("k", admitted[0])  # idempotent
    assert await q.active_streams("k") == 4
    assert await rds.zscore("streams:k:lease", admitted[0]) is None  # its lease went with it
    assert await rds.zcard("streams:k:lease") == 4
    assert (await q.admit("k", "again", Limits(max_streams=5), NOW)).admitted


async def test_rpm_sliding_window_and_no_slot_leak(rds: aioredis.Redis) -> None:
    q = QuotaStore(rds, lease_s=LEASE_S)
    lim = Limits(max_streams=10, rpm=3)
    for i in range(3):
        r = await q.admit("k", f"a{i}", lim, NOW + timedelta(seconds=i))
        assert r.admitted
        assert r.remaining_requests() == 2 - i
        await q.release("k", f"a{i}")
    refused = await q.admit("k", "b", lim, NOW + timedelta(seconds=10))
    assert refused.verdict is Verdict.RPM
    assert refused.retry_after_s == pytest.approx(50.0)
    assert await rds.scard("streams:k") == 0  # a refused request holds no slot
    later = await q.admit("k", "c", lim, NOW + timedelta(seconds=60.5))
    assert later.admitted


async def test_tokens_per_day(rds: aioredis.Redis) -> None:
    q = QuotaStore(rds, lease_s=LEASE_S)
    await rds.set("tpd:k:20261129", 1000)
    r = await q.admit("k", "x", Limits(tokens_per_day=1000), NOW)
    assert r.verdict is Verdict.TOKENS_PER_DAY
    assert r.retry_after_s == pytest.approx(14 * 3600)
    ok = await q.admit("k", "y", Limits(tokens_per_day=1001), NOW)
    assert ok.admitted
    assert ok.remaining_tokens() == 1


async def test_stale_lease_is_pruned(rds: aioredis.Redis) -> None:
    q = QuotaStore(rds, lease_s=10)
    assert (await q.admit("k", "dead-gw", Limits(max_streams=1), NOW)).admitted
    assert not (await q.admit("k", "next", Limits(max_streams=1), NOW + timedelta(seconds=5))).admitted
    assert (await q.admit("k", "next", Limits(max_streams=1), NOW + timedelta(seconds=11))).admitted
    assert await rds.smembers("streams:k") == {b"next"}


async def test_settle_usage_counts_tokens_once(rds: aioredis.Redis, migrated_db_url: str) -> None:
    from psycopg_pool import AsyncConnectionPool

    from apps.core.identity.keys import KeyStore
    from apps.core.ledger.pg import PgLedger
    from apps.core.ledger.teams import TeamStore
    from apps.core.metering import settle_usage
    from apps.core.spec import Prices

    async with AsyncConnectionPool(migrated_db_url, min_size=1, max_size=4) as pool:
        teams = TeamStore(pool)
        team = await teams.create_team("t")
        await teams.add_credits(team.id, 10**9)
        _, rec = await KeyStore(pool, b"s").create(team=team.id)
        lg = PgLedger(
            pool, {"m": Prices(prompt_per_million_microcredits=1, completion_per_million_microcredits=1)}
        )
        await lg.reserve(
            request_id="r", team_id=team.id, key_id=rec.id, model="m", estimated_prompt_tokens=5, max_tokens=5
        )
        for _ in range(3):
            await settle_usage(lg, rds, "r", 5, 7, now=NOW)
    assert await rds.get(f"tpd:{rec.id}:20261129") == b"12"
    assert 0 < await rds.ttl(f"tpd:{rec.id}:20261129") <= 2 * 86400


async def test_a_request_id_holding_a_slot_is_a_duplicate_and_writes_nothing(rds: aioredis.Redis) -> None:
    q = QuotaStore(rds, lease_s=LEASE_S)
    lim = Limits(max_streams=2, rpm=10)
    assert (await q.admit("k", "same", lim, NOW)).admitted
    again = await q.admit("k", "same", lim, NOW + timedelta(seconds=1))
    assert again.verdict is Verdict.DUPLICATE
    assert await rds.zcard("rl:k:rpm") == 1  # no rpm slot spent on the duplicate
    await q.release("k", "same")
    assert (await q.admit("k", "same", lim, NOW + timedelta(seconds=2))).admitted  # finished: reusable here
