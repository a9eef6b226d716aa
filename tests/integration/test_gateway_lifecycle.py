"""The gateway once told to stop (SIGTERM, `Lifecycle.stopping`): `/readyz` is 503 and a chat
request that still reaches it is refused with 503 `shutting_down` before anything is reserved.
(The real process under SIGTERM: tests/chaos/test_gateway_shutdown.py.)"""

from __future__ import annotations

import httpx
import pytest

from tests.fakes.fake_gateway import GatewayEnv
from tests.integration.gateway_fixtures import gateway

__all__ = ["gateway"]  # the fixture, imported for pytest

MODEL = "llama-3.1-8b-instruct"


@pytest.fixture
def env(gateway: GatewayEnv) -> GatewayEnv:
    return gateway


async def test_a_stopping_gateway_is_not_ready_and_refuses_new_chats(env: GatewayEnv) -> None:
    team_id, key = await env.team_with_key("a")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=env.app), base_url="http://gw") as c:
        assert (await c.get("/readyz")).status_code == 200
        assert (await c.post("/v1/chat/completions", json=body, headers=headers)).status_code == 200
        balance = (await env.deps.teams.get_team(team_id)).balance_microcredits

        env.deps.lifecycle.stopping = True

        ready = await c.get("/readyz")
        assert (ready.status_code, ready.json()) == (503, {"stopping": True})
        r = await c.post("/v1/chat/completions", json=body, headers=headers)
        assert r.status_code == 503
        assert r.headers["retry-after"] == "1"
        error = r.json()["error"]
        assert (error["code"], error["type"]) == ("shutting_down", "service_unavailable")
        assert (await c.get("/livez")).status_code == 200  # alive: it is finishing its streams
    # Refused before admission: no reservation, no money moved.
    assert (await env.deps.teams.get_team(team_id)).balance_microcredits == balance
    assert len(env.dispatcher.requests) == 1
