"""The gateway's per-request SLI metrics, in-process against real PostgreSQL and Redis and the real
platform behind it (`tests/fleet.py`): each finished stream's own tokens/s, its SLO verdict per team,
and 503s counted by reason."""

from __future__ import annotations

import httpx

from tests.chaos.helpers import metric_sum
from tests.fleet import FleetSetup
from tests.gateway_env import gateway_env

MODEL = "llama-3.1-8b-instruct"


def _chat(**extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}


async def test_a_finished_stream_records_its_rate_and_slo_verdict_per_team(
    migrated_db_url: str, redis_url: str
) -> None:
    async with gateway_env(migrated_db_url, redis_url) as env:
        team_id, key = await env.team_with_key("alpha")
        transport = httpx.ASGITransport(app=env.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            headers = {"Authorization": f"Bearer {key}"}
            # The rate needs the completion tokens: streams that ask for usage, and every non-stream.
            bodies = [_chat(stream=True, stream_options={"include_usage": True}), _chat()]
            for body in bodies:
                r = await c.post("/v1/chat/completions", json=body, headers=headers)
                assert r.status_code == 200, r.text
            text = (await c.get("/metrics")).text
    assert metric_sum(text, "llmfleet_gateway_stream_tokens_per_second_count", model=MODEL) == 1
    # The team's id, never its name (issue 27): /metrics must not list who the tenants are.
    assert metric_sum(text, "llmfleet_gateway_slo_requests_total", team=str(team_id), model=MODEL) == 2
    assert 'team="alpha"' not in text
    # A verdict for each (met or missed: the machine's speed decides, not the test).
    verdicts = [metric_sum(text, "llmfleet_gateway_slo_requests_total", result=r) for r in ("met", "missed")]
    assert sum(verdicts) == 2, verdicts
    assert metric_sum(text, "llmfleet_gateway_active_streams") == 0  # both relays ended


async def test_503_from_the_orchestrator_is_counted_with_its_reason(
    migrated_db_url: str, redis_url: str
) -> None:
    # No node serves the model: the orchestrator's 503 `model_unavailable`.
    async with gateway_env(migrated_db_url, redis_url, fleet=FleetSetup(nodes=0)) as env:
        _, key = await env.team_with_key("beta")
        transport = httpx.ASGITransport(app=env.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            r = await c.post("/v1/chat/completions", json=_chat(), headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 503
            text = (await c.get("/metrics")).text
    assert (
        metric_sum(
            text, "llmfleet_gateway_refusals_total", model=MODEL, status="503", reason="model_unavailable"
        )
        == 1
    )
    assert metric_sum(text, "llmfleet_gateway_slo_requests_total") == 0  # refused: no SLO verdict
