"""Issue 15 quota defects, through the gateway app against real PostgreSQL and Redis: the stream
slot's lease (the longest request plus a margin, not an hour) and `tokens_per_day` for JWT callers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx

from apps.core.quota.admission import Limits
from apps.gateway.settings import GatewaySettings
from tests.fakes.fake_gateway import GatewayEnv, gateway_env

MODEL = "llama-3.1-8b-instruct"


def chat(**extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}


def client(env: GatewayEnv) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=env.app), base_url="http://gw")


class FakeNow:
    def __init__(self, start: datetime) -> None:
        self.at = start

    def __call__(self) -> datetime:
        return self.at


def test_the_lease_is_the_longest_request_plus_a_margin() -> None:
    settings = GatewaySettings(max_request_s=900, stream_lease_margin_s=60)
    assert settings.stream_lease_s == 960
    assert GatewaySettings(max_request_s=120).stream_lease_s == 120 + GatewaySettings().stream_lease_margin_s


async def test_a_crashed_gateways_slot_frees_after_the_lease(migrated_db_url: str, redis_url: str) -> None:
    async with gateway_env(migrated_db_url, redis_url) as env:
        now = FakeNow(datetime.now(UTC))
        env.deps.clock = now
        _, key = await env.team_with_key("crashed", max_streams=1)
        [record] = await env.deps.keys.list_keys("crashed")
        # Another gateway admitted a stream for this key and died before releasing the slot.
        taken = await env.deps.quota.admit(
            str(record.id), "chatcmpl-dead-gateway", Limits(max_streams=1), now()
        )
        assert taken.admitted
        lease_ms = int(env.settings.stream_lease_s * 1000)
        assert lease_ms == (900 + 60) * 1000  # the defaults: max_request_s + stream_lease_margin_s
        # Redis lets the slot go by itself (nothing else alive touches the key) within the lease...
        ttl = await env.redis.pttl(f"streams:{record.id}")
        assert 0 < ttl <= lease_ms
        auth = {"Authorization": f"Bearer {key}"}
        async with client(env) as c:
            refused = await c.post("/v1/chat/completions", json=chat(), headers=auth)
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "max_streams"
            assert int(refused.headers["retry-after"]) <= env.settings.stream_lease_s
            # ... and while other requests keep the set alive, the dead slot's lease is pruned.
            now.at += timedelta(seconds=env.settings.stream_lease_s - 1)
            still = await c.post("/v1/chat/completions", json=chat(), headers=auth)
            assert still.status_code == 429, still.text
            now.at += timedelta(seconds=2)
            freed = await c.post("/v1/chat/completions", json=chat(), headers=auth)
            assert freed.status_code == 200, freed.text
        assert await env.redis.smembers(f"streams:{record.id}") == set()


async def test_tokens_per_day_counts_for_jwt_callers(migrated_db_url: str, redis_url: str) -> None:
    # Each request's worst case is 60 tokens (a 56-token prompt bound + max_tokens 4) and it
    # settles 15 (11 + 4): with 100 a day, three pass and the fourth is refused.
    async with gateway_env(migrated_db_url, redis_url, jwt_tokens_per_day=100) as env:
        team = await env.deps.teams.create_team("ml")
        await env.deps.teams.add_credits(team.id, 1_000_000_000)
        auth = {"Authorization": f"Bearer {env.issuer.mint('alice', team='ml')}"}
        today = f"tpd:jwt-alice:{datetime.now(UTC):%Y%m%d}"
        async with client(env) as c:
            for i in range(3):
                r = await c.post("/v1/chat/completions", json=chat(), headers=auth)
                assert r.status_code == 200, r.text
                assert r.json()["usage"]["total_tokens"] == 15
                assert int(await env.redis.get(today) or 0) == 15 * (i + 1)
                assert await env.redis.hlen("tpd:jwt-alice:inflight") == 0  # the settle took it out
            refused = await c.post("/v1/chat/completions", json=chat(), headers=auth)
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "tokens_per_day"
        async with env.pool.connection() as conn:
            cur = await conn.execute("SELECT DISTINCT quota_subject FROM usage_ledger WHERE key_id IS NULL")
            assert await cur.fetchall() == [("jwt-alice",)]
