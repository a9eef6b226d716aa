"""Issue 15 quota defects, through the gateway app against real PostgreSQL and Redis: the stream
slot's lease (the longest request plus a margin, not an hour) and `tokens_per_day` for JWT callers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx

from apps.core.metering import tpd_key
from apps.core.quota.admission import Limits
from apps.enginesim.textgen import chat_prompt_tokens
from apps.gateway.settings import GatewaySettings
from apps.gateway.validate import estimate_prompt_tokens
from tests.gateway_env import GatewayEnv, gateway_env

MODEL = "llama-3.1-8b-instruct"


HI = [{"role": "user", "content": "hi"}]


def chat(**extra: object) -> dict[str, object]:
    # `ignore_eos`: exactly 4 completion tokens.
    return {"model": MODEL, "messages": HI, "max_tokens": 4, "ignore_eos": True, **extra}


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
    # Each request's worst case is 60 tokens (the gateway's 56-token prompt bound + max_tokens 4) and
    # it settles the engine's prompt count + 4: with room for two settled requests and a worst case
    # but not three, three pass and the fourth is refused.
    settles = chat_prompt_tokens(HI) + 4  # enginesim's own count of the prompt
    worst = estimate_prompt_tokens(HI) + 4
    async with gateway_env(migrated_db_url, redis_url, jwt_tokens_per_day=3 * settles + worst - 1) as env:
        # One instant for admission and settle: the four requests count on one UTC day whenever the
        # test runs (a run across midnight would otherwise start a fresh day and admit the fourth).
        noon = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0)
        env.deps.clock = FakeNow(noon)
        team = await env.deps.teams.create_team("ml")
        await env.deps.teams.add_credits(team.id, 1_000_000_000)
        auth = {"Authorization": f"Bearer {env.issuer.mint('alice', team='ml')}"}
        today = tpd_key("jwt-alice", noon)
        async with client(env) as c:
            for i in range(3):
                r = await c.post("/v1/chat/completions", json=chat(), headers=auth)
                assert r.status_code == 200, r.text
                assert r.json()["usage"]["total_tokens"] == settles
                await env.settled()  # the orchestrator's settle counts the request's tokens
                assert int(await env.redis.get(today) or 0) == settles * (i + 1)
                assert await env.redis.hlen("tpd:jwt-alice:inflight") == 0  # the settle took it out
            refused = await c.post("/v1/chat/completions", json=chat(), headers=auth)
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "tokens_per_day"
        async with env.pool.connection() as conn:
            cur = await conn.execute("SELECT DISTINCT quota_subject FROM usage_ledger WHERE key_id IS NULL")
            assert await cur.fetchall() == [("jwt-alice",)]
