"""Team-level limits on top of the keys' (issue 19): concurrent streams and tokens per minute per
team, checked in the same admission script (real Redis) and visible through the gateway (429 with
Retry-After, `x-ratelimit-*` for the nearest token limit)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
import redis.asyncio as aioredis

from apps.core.quota.admission import Limits, QuotaStore, TeamLimits, Verdict
from tests.gateway_env import GatewayEnv
from tests.integration.gateway_fixtures import client, gateway  # noqa: F401 (fixture)

NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
MODEL = "llama-3.1-8b-instruct"


@pytest.fixture
async def rds(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    c = aioredis.Redis.from_pool(aioredis.BlockingConnectionPool.from_url(redis_url, max_connections=50))
    yield c
    await c.aclose()


async def test_team_streams_hold_across_the_teams_keys(rds: aioredis.Redis) -> None:
    q = QuotaStore(rds, lease_s=960.0)
    team = TeamLimits(7, max_streams=3)
    # Many keys of one team, each with room of its own: the team's limit is what binds.
    results = await asyncio.gather(
        *(q.admit(f"key{i % 10}", f"r{i}", Limits(max_streams=100, team=team), NOW) for i in range(50))
    )
    assert sum(r.admitted for r in results) == 3
    assert {r.verdict for r in results if not r.admitted} == {Verdict.TEAM_MAX_STREAMS}
    assert all(r.retry_after_s >= 1 for r in results if not r.admitted)
    # A refused request holds nothing: no key slot, no rpm slot.
    assert sum([await rds.scard(f"streams:key{i}") for i in range(10)]) == 3
    first = next(i for i, r in enumerate(results) if r.admitted)
    await q.release(f"key{first % 10}", f"r{first}", team_id=7)
    assert await rds.scard("tstreams:7") == 2
    assert (await q.admit("key0", "again", Limits(team=team), NOW)).admitted
    # Another team is not affected.
    assert (await q.admit("key0", "other", Limits(team=TeamLimits(8, max_streams=1)), NOW)).admitted


async def test_team_tokens_per_minute_slide(rds: aioredis.Redis) -> None:
    q = QuotaStore(rds, lease_s=960.0)
    team = TeamLimits(9, tokens_per_minute=1000)
    ok = await q.admit("a", "r1", Limits(team=team), NOW, worst_case_tokens=600)
    assert ok.admitted
    assert ok.remaining_team_tokens() == 400
    refused = await q.admit("b", "r2", Limits(team=team), NOW + timedelta(seconds=10), worst_case_tokens=600)
    assert refused.verdict is Verdict.TEAM_TOKENS_PER_MINUTE
    assert 49 <= refused.retry_after_s <= 51  # when r1's second leaves the window
    assert (
        await q.admit("b", "r3", Limits(team=team), NOW + timedelta(seconds=10), worst_case_tokens=400)
    ).admitted
    later = await q.admit("b", "r4", Limits(team=team), NOW + timedelta(seconds=61), worst_case_tokens=600)
    assert later.admitted  # r1 left the window


async def test_gateway_refuses_past_the_team_limit_and_reports_the_nearest(
    gateway: GatewayEnv,  # noqa: F811
) -> None:
    env, h = gateway, gateway.admin_headers()
    _, key = await env.team_with_key("ml", tokens_per_day=1_000_000)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}
    async with client(env) as c:
        r = await c.post("/admin/teams/sharing", json={"team": "ml", "tokens_per_minute": 150}, headers=h)
        assert r.status_code == 200, r.text
        assert r.json()["tokens_per_minute"] == 150
        r = await c.post("/v1/chat/completions", json=chat, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200
        # The team's per-minute budget is nearer than the key's daily one: its headers.
        assert r.headers["x-ratelimit-limit-tokens"] == "150"
        remaining = int(r.headers["x-ratelimit-remaining-tokens"])
        assert 0 <= remaining < 150
        r = await c.post("/v1/chat/completions", json=chat, headers={"Authorization": f"Bearer {key}"})
        r = await c.post("/v1/chat/completions", json=chat, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 429
        assert r.json()["error"]["code"] == "team_tokens_per_minute"
        assert int(r.headers["retry-after"]) >= 1
        # Clearing the limit (null) restores the key's own.
        r = await c.post("/admin/teams/sharing", json={"team": "ml", "tokens_per_minute": None}, headers=h)
        assert r.json()["tokens_per_minute"] is None
        r = await c.post("/admin/teams/sharing", json={"team": "ml", "max_streams": -1}, headers=h)
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "max_streams"
