"""The gateway once told to stop (SIGTERM, `Lifecycle.stopping`): `/readyz` is 503 and a chat
request that still reaches it is refused with 503 `shutting_down` before anything is reserved.
(The real process under SIGTERM: tests/chaos/test_gateway_shutdown.py.)"""

from __future__ import annotations

import asyncio
import signal

import httpx
import pytest

from apps.gateway.cli import RETIRE_SIGNAL, StoppingServer, uvicorn_config
from tests.gateway_env import GatewayEnv
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
        await env.settled()  # the orchestrator's settle of that request has moved its money
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


async def test_a_worker_retired_by_a_roll_stays_ready_until_the_gateway_itself_stops(env: GatewayEnv) -> None:
    """A roll retires one worker (`RETIRE_SIGNAL`) while the others serve the same socket: it stops
    accepting, but what it already accepted is served as ready. Before, the supervisor sent SIGTERM and
    a `/readyz` on a connection accepted just before the listener closed got 503 (the one-worker roll
    test saw it under load). A SIGTERM afterwards (the whole gateway stopping) turns it not-ready."""
    server = StoppingServer(uvicorn_config(env.app, env.settings), env.deps.lifecycle, retire_linger_s=600)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=env.app), base_url="http://gw") as c:
        server.retire(RETIRE_SIGNAL, None)
        await asyncio.sleep(0)  # what `retire` scheduled on this loop runs (a yield, not a wait)
        # Lingering: a connection accepted just before the listener closed still gets its request read.
        assert not server.should_exit
        ready = await c.get("/readyz")
        assert (ready.status_code, ready.json()) == (200, {"postgres": True, "redis": True})

        server.handle_exit(signal.SIGTERM, None)
        await asyncio.sleep(0)
        assert server.should_exit  # at once: the whole gateway is stopping
        ready = await c.get("/readyz")
        assert (ready.status_code, ready.json()) == (503, {"stopping": True})
