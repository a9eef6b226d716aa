"""The gateway's `/metrics` (issue 27): team ids only, and only for the metrics port, loopback or the
metrics token; in-process (httpx ASGI) on real PostgreSQL and Redis."""

from __future__ import annotations

import httpx

from tests.gateway_env import GatewayEnv, gateway_env

MODEL = "llama-3.1-8b-instruct"
REMOTE = ("203.0.113.7", 40000)


def client(env: GatewayEnv, peer: tuple[str, int] = ("127.0.0.1", 40000)) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=env.app, client=peer), base_url="http://gw")


async def test_gateway_metrics_name_no_team_and_refuse_remote_scrapes(
    migrated_db_url: str, redis_url: str
) -> None:
    """Unauthenticated gateway /metrics listed team names to anyone reaching the API port."""
    async with gateway_env(migrated_db_url, redis_url) as env:
        team_id, key = await env.team_with_key("secret-tenant")
        async with client(env) as c:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            r = await c.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text
            local = await c.get("/metrics")
        assert local.status_code == 200
        assert f'team="{team_id}"' in local.text
        assert "secret-tenant" not in local.text
        async with client(env, REMOTE) as remote:
            r = await remote.get("/metrics")
        assert r.status_code == 404
        assert r.json()["error"]["message"].startswith("Metrics are served on the metrics port")


async def test_with_a_metrics_token_every_scrape_needs_it(migrated_db_url: str, redis_url: str) -> None:
    async with gateway_env(migrated_db_url, redis_url, metrics_token="scrape-secret") as env:
        for peer in (("127.0.0.1", 40000), REMOTE):
            async with client(env, peer) as c:
                for headers in ({}, {"Authorization": "Bearer nope"}, env.admin_headers()):
                    r = await c.get("/metrics", headers=headers)
                    assert r.status_code == 401, headers
                    assert r.json()["error"]["code"] == "invalid_metrics_token"
                r = await c.get("/metrics", headers={"Authorization": "Bearer scrape-secret"})
                assert r.status_code == 200
                assert "llmfleet_gateway" in r.text
