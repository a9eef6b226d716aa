"""Failure paths against real PostgreSQL: Redis unreachable, revocation across replicas, engine death
(the gateway in front of the real platform in-process, `tests/fleet.py`)."""

from __future__ import annotations

import httpx
import pytest
from psycopg_pool import AsyncConnectionPool

from apps.core.errors import AuthenticationFailed
from apps.core.identity.keys import KeyStore
from apps.core.ledger.teams import TeamStore
from apps.enginesim.faults import Faults
from tests.fleet import FleetSetup
from tests.gateway_env import gateway_env

MODEL = "llama-3.1-8b-instruct"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
DEAD_REDIS = "redis://127.0.0.1:1/0"


async def test_redis_down_fails_closed_with_503_and_metric(migrated_db_url: str, redis_url: str) -> None:
    # The gateway is cut off from Redis; the orchestrator is not.
    async with gateway_env(migrated_db_url, DEAD_REDIS, fleet_redis_url=redis_url) as env:
        _, key = await env.team_with_key("a")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=env.app), base_url="http://gw") as c:
            r = await c.post("/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {key}"})
            ready = await c.get("/readyz")
            metrics = (await c.get("/metrics")).text
    assert r.status_code == 503
    assert r.headers["retry-after"] == "5"
    assert "fail closed" in r.json()["error"]["message"]
    assert ready.status_code == 503
    assert ready.json() == {"postgres": True, "redis": False}
    assert "llmfleet_gateway_redis_errors_total 1.0" in metrics
    assert 'llmfleet_gateway_rejections_total{reason="redis_unavailable"} 1.0' in metrics
    assert env.dispatcher.requests == []


async def test_redis_down_fail_open_setting_admits(migrated_db_url: str, redis_url: str) -> None:
    async with gateway_env(
        migrated_db_url, DEAD_REDIS, fleet_redis_url=redis_url, redis_fail_open=True
    ) as env:
        _, key = await env.team_with_key("a")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=env.app), base_url="http://gw") as c:
            r = await c.post("/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200


async def test_revocation_reaches_another_replica_within_the_cache_ttl(migrated_db_url: str) -> None:
    clock = [1000.0]
    async with AsyncConnectionPool(migrated_db_url, min_size=1, max_size=4) as pool:
        team = await TeamStore(pool).create_team("t")
        replica_a = KeyStore(pool, b"s", cache_ttl_s=4.0, monotonic=lambda: clock[0])
        replica_b = KeyStore(pool, b"s", cache_ttl_s=4.0, monotonic=lambda: clock[0])
        secret, record = await replica_b.create(team=team.id)
        assert (await replica_a.authenticate(secret)).key_id == record.id
        assert replica_a.db_lookups == 1
        await replica_a.authenticate(secret)
        assert replica_a.db_lookups == 1  # served from the cache
        assert await replica_b.revoke(record.id)
        clock[0] += 4.01
        with pytest.raises(AuthenticationFailed):
            await replica_a.authenticate(secret)


async def test_engine_death_mid_stream_gives_error_event_and_settles_partial(
    migrated_db_url: str, redis_url: str
) -> None:
    # The engine drops the connection after 3 content chunks (no [DONE]): no other node to resume on.
    died = FleetSetup(faults=Faults(die_after_tokens=3))
    async with gateway_env(migrated_db_url, redis_url, fleet=died) as env:
        _, key = await env.team_with_key("a", max_streams=2)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=env.app), base_url="http://gw") as c:
            r = await c.post(
                "/v1/chat/completions",
                json={**BODY, "stream": True},
                headers={"Authorization": f"Bearer {key}"},
            )
            assert r.status_code == 200
            assert 'data: {"error"' in r.text
            assert r.text.endswith("data: [DONE]\n\n")
            relayed = r.text.count('"content":"') - r.text.count('"content":""')
            non_stream = await c.post(
                "/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {key}"}
            )
        assert non_stream.status_code == 502
        await env.settled()
        async with env.pool.connection() as conn:
            rows = await (
                await conn.execute("SELECT status::text, completion_tokens FROM usage_ledger ORDER BY id")
            ).fetchall()
        # What ran is billed, for the stream and for the non-streaming request alike.
        assert relayed == 3
        assert rows == [("settled", 3), ("settled", 3)]
        assert await env.redis.scard("streams:1") == 0
