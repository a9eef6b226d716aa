"""The gateway in-process (httpx ASGI transport) against real PostgreSQL and Redis, in front of the
real platform in-process (`tests/fleet.py`: orchestrator, agent, enginesim)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from apps.core.protocol.dispatch import QUEUE_WAIT_HEADER
from tests.fakes.static_resolver import StaticResolver
from tests.fleet import FleetSetup
from tests.gateway_env import GatewayEnv, gateway_env
from tests.utcdays import day_labels, tokens_counted

MODEL = "llama-3.1-8b-instruct"
BIG = "llama-3.3-70b-instruct-fp8"


MESSAGES = [{"role": "user", "content": "hi"}]


def chat(**extra: object) -> dict[str, object]:
    # `ignore_eos` (a vLLM extra the gateway forwards): the answer is exactly `max_tokens` long.
    return {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, "ignore_eos": True, **extra}


@pytest.fixture
async def env(migrated_db_url: str, redis_url: str) -> AsyncIterator[GatewayEnv]:
    resolver = StaticResolver({"internal.example": ["10.0.0.5"], "public.example": ["93.184.216.34"]})
    async with gateway_env(migrated_db_url, redis_url, resolver=resolver) as e:
        yield e


def client(env: GatewayEnv) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=env.app), base_url="http://gw")


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_non_streaming_completion_settles_and_reports_usage(env: GatewayEnv) -> None:
    started = datetime.now(UTC)
    prompt = await env.fleet.prompt_tokens(MESSAGES)
    _team_id, key = await env.team_with_key("a", rpm=100, tokens_per_day=10_000)
    async with client(env) as c:
        r = await c.post("/v1/chat/completions", json=chat(), headers=auth(key))
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["finish_reason"] == "length"
        message = body["choices"][0]["message"]
        # OpenAI's schema requires `refusal` in a message (issue 27 item 10); vLLM sends it null.
        assert message == {"role": "assistant", "content": message["content"], "refusal": None}
        assert isinstance(message["content"], str)
        assert message["content"].strip()
        usage = body["usage"]
        assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (
            prompt,
            4,
            prompt + 4,
        )
        # The engine reports cached input as the platform's vLLM does (`--enable-prompt-tokens-details`).
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0
        assert r.headers["x-ratelimit-limit-requests"] == "100"
        assert r.headers["x-ratelimit-remaining-requests"] == "99"
        assert r.headers["x-ratelimit-limit-tokens"] == "10000"
        assert r.headers["x-request-id"].startswith("chatcmpl-")
        sent = env.dispatcher.requests[0]
        # The client's fields and its intent: the agent streams the engine with usage on.
        assert "stream" not in sent.body
        assert sent.client_wants_usage is True
        assert sent.wants_chunk_usage is False
        await env.settled()  # the orchestrator settles from the node's report, on its own workers
        usage = (await c.get("/v1/usage", headers=auth(key))).json()
        assert usage["data"][0]["completion_tokens"] == 4
        assert usage["total"]["prompt_tokens"] == prompt
    assert await env.redis.scard(f"streams:{sent.key_id}") == 0
    assert await tokens_counted(env.redis, sent.key_id, started) == prompt + 4


async def test_streaming_relays_bytes_and_strips_usage_when_not_asked(env: GatewayEnv) -> None:
    _, key = await env.team_with_key("a")
    async with client(env) as c:
        r = await c.post(
            "/v1/chat/completions", json=chat(stream=True, unknown_field={"x": 1}), headers=auth(key)
        )
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        text = r.text
    assert text.endswith("data: [DONE]\n\n")
    assert '"usage"' not in text
    assert env.dispatcher.requests[0].client_wants_usage is False
    assert "unknown_field" not in env.dispatcher.requests[0].body  # only OpenAI fields + engine extras


async def test_client_request_id_is_honoured(env: GatewayEnv) -> None:
    _, key = await env.team_with_key("a")
    async with client(env) as c:
        r = await c.post(
            "/v1/chat/completions", json=chat(), headers={**auth(key), "x-request-id": "my-req-0001"}
        )
        assert r.headers["x-request-id"] == "my-req-0001"
        bad = await c.post(
            "/v1/chat/completions", json=chat(), headers={**auth(key), "x-request-id": "bad id!"}
        )
        assert bad.headers["x-request-id"] != "bad id!"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (json.dumps({"model": MODEL}).encode(), 400, "messages"),
        (json.dumps(chat(stream="yes")).encode(), 400, "stream"),
        (json.dumps(chat(max_tokens=999_999)).encode(), 400, "max_tokens"),
        (json.dumps(chat(max_tokens="5")).encode(), 400, "max_tokens"),
        (json.dumps(chat(model="nope")).encode(), 404, "model"),
        (
            json.dumps(
                chat(
                    messages=[
                        {
                            "role": "user",
                            "content": [
                                {"type": "image_url", "image_url": {"url": "http://169.254.169.254/x"}}
                            ],
                        }
                    ]
                )
            ).encode(),
            400,
            "messages.0.content.0.image_url.url",
        ),
        (
            json.dumps(
                chat(
                    messages=[
                        {"role": "user", "content": [{"audio_url": {"url": "http://internal.example/a"}}]}
                    ]
                )
            ).encode(),
            400,
            "messages.0.content.0.audio_url.url",
        ),
        (
            json.dumps(
                chat(
                    messages=[
                        {
                            "role": "user",
                            "content": [{"type": "video_url", "video_url": "file:///etc/passwd"}],
                        }
                    ]
                )
            ).encode(),
            400,
            "messages.0.content.0.video_url",
        ),
    ],
)
async def test_bad_requests(env: GatewayEnv, body: bytes, status: int, param: str | None) -> None:
    _, key = await env.team_with_key("a")
    async with client(env) as c:
        r = await c.post("/v1/chat/completions", content=body, headers=auth(key))
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param
    assert env.dispatcher.requests == []


async def test_public_url_passes_ssrf(env: GatewayEnv) -> None:
    _, key = await env.team_with_key("a")
    async with client(env) as c:
        r = await c.post(
            "/v1/chat/completions", json=chat(x={"url": "https://public.example/a.png"}), headers=auth(key)
        )
    assert r.status_code == 200


async def test_body_too_large_is_413(env: GatewayEnv) -> None:
    _, key = await env.team_with_key("a")
    async with client(env) as c:
        r = await c.post("/v1/chat/completions", json=chat(pad="x" * (1024 * 1024 + 1)), headers=auth(key))
    assert r.status_code == 413


async def test_auth_and_allowlist(env: GatewayEnv) -> None:
    _, key = await env.team_with_key("a", model_allowlist=[MODEL])
    async with client(env) as c:
        assert (await c.post("/v1/chat/completions", json=chat())).status_code == 401
        assert (
            await c.post("/v1/chat/completions", json=chat(), headers=auth("sk-lf-wrong"))
        ).status_code == 401
        r = await c.post("/v1/chat/completions", json=chat(model=BIG), headers=auth(key))
        assert r.status_code == 403
        models = (await c.get("/v1/models", headers=auth(key))).json()
        assert [m["id"] for m in models["data"]] == [MODEL]


async def test_expired_key_is_401(env: GatewayEnv) -> None:
    _, key = await env.team_with_key("a", expires_at=datetime.now(UTC) - timedelta(seconds=1))
    async with client(env) as c:
        r = await c.post("/v1/chat/completions", json=chat(), headers=auth(key))
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "expired_api_key"


async def test_no_balance_is_402_and_releases_slot(env: GatewayEnv) -> None:
    _, key = await env.team_with_key("poor", credits=0, max_streams=1)
    async with client(env) as c:
        r = await c.post("/v1/chat/completions", json=chat(), headers=auth(key))
        assert r.status_code == 402
        assert r.json()["error"]["type"] == "insufficient_quota"
        r2 = await c.post("/v1/chat/completions", json=chat(), headers=auth(key))
        assert r2.status_code == 402  # not 429: the first request's slot was released


async def test_rpm_limit_429_with_retry_after(env: GatewayEnv) -> None:
    _, key = await env.team_with_key("a", rpm=2)
    async with client(env) as c:
        for _ in range(2):
            assert (await c.post("/v1/chat/completions", json=chat(), headers=auth(key))).status_code == 200
        r = await c.post("/v1/chat/completions", json=chat(), headers=auth(key))
    assert r.status_code == 429
    assert r.json()["error"]["code"] == "rpm"
    assert 1 <= int(r.headers["retry-after"]) <= 60
    assert r.headers["x-ratelimit-remaining-requests"] == "0"


async def test_orchestrator_503_cancels_reservation(migrated_db_url: str, redis_url: str) -> None:
    # No node serves the model: the orchestrator answers 503 `model_unavailable` at once.
    async with gateway_env(migrated_db_url, redis_url, fleet=FleetSetup(nodes=0)) as e:
        _, key = await e.team_with_key("a", max_streams=1)
        async with client(e) as c:
            r = await c.post("/v1/chat/completions", json=chat(), headers=auth(key))
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "model_unavailable"
        assert r.headers["retry-after"] == "30"
        async with e.pool.connection() as conn:
            rows = await (await conn.execute("SELECT status::text FROM usage_ledger")).fetchall()
        assert rows == [("cancelled",)]
        assert await e.redis.scard("streams:1") == 0


async def test_usage_is_scoped_to_the_callers_team(env: GatewayEnv) -> None:
    started = datetime.now(UTC)
    _, key_a = await env.team_with_key("team-a")
    _, key_b = await env.team_with_key("team-b")
    async with client(env) as c:
        assert (await c.post("/v1/chat/completions", json=chat(), headers=auth(key_a))).status_code == 200
        await env.settled()
        a = (await c.get("/v1/usage?team=team-a", headers=auth(key_a))).json()
        b = (await c.get("/v1/usage?team=team-a&team_id=1", headers=auth(key_b))).json()
        day = (await c.get("/v1/usage?group_by=day", headers=auth(key_a))).json()
        unix = int(datetime.now(UTC).timestamp())
        window = await c.get(f"/v1/usage?from={unix - 60}&to={unix + 60}", headers=auth(key_a))
    assert a["team"] == "team-a"
    assert a["total"]["requests"] == 1
    assert b["team"] == "team-b"
    assert b["data"] == []
    assert b["total"]["requests"] == 0
    assert day["data"][0]["day"] in day_labels(started)  # today, or yesterday on a run across midnight
    assert window.json()["total"]["requests"] == 1


async def test_admin_api_flow_and_revocation(env: GatewayEnv) -> None:
    h = env.admin_headers()
    async with client(env) as c:
        r = await c.post("/admin/teams", json={"name": "ml"}, headers=h)
        assert r.status_code == 201
        assert (await c.post("/admin/teams", json={"name": "ml"}, headers=h)).status_code == 409
        r = await c.post("/admin/credits", json={"team": "ml", "amount": 12.5}, headers=h)
        assert r.json()["balance_microcredits"] == 12_500_000
        r = await c.post(
            "/admin/keys",
            json={
                "team": "ml",
                "model_allowlist": [MODEL],
                "rpm": 10,
                "tokens_per_day": 1000,
                "max_streams": 2,
            },
            headers=h,
        )
        assert r.status_code == 201
        created = r.json()
        key = created["key"]
        assert key.startswith("sk-lf-")
        listed = (await c.get("/admin/keys?team=ml", headers=h)).json()["data"]
        assert len(listed) == 1
        assert "key" not in listed[0]
        assert key not in json.dumps(listed)
        teams = (await c.get("/admin/teams", headers=h)).json()["data"]
        assert teams[0]["name"] == "ml"
        assert (await c.post("/v1/chat/completions", json=chat(), headers=auth(key))).status_code == 200
        assert (await c.delete(f"/admin/keys/{created['id']}", headers=h)).status_code == 200
        assert (await c.post("/v1/chat/completions", json=chat(), headers=auth(key))).status_code == 401
        nodes = (await c.get("/admin/nodes", headers=h)).json()
        assert [n["node_id"] for n in nodes["data"]] == [env.fleet.node_id]  # the fleet's own node only
        # An API key or a non-admin JWT is not an admin.
        assert (await c.get("/admin/teams", headers=auth(key))).status_code == 403
        user = env.issuer.mint("u", team="ml")
        assert (await c.get("/admin/teams", headers=auth(user))).status_code == 403
        # A JWT with a team may call the API as that team.
        r = await c.post("/v1/chat/completions", json=chat(), headers=auth(user))
        assert r.status_code == 200


async def test_readyz_livez_metrics(env: GatewayEnv) -> None:
    _, key = await env.team_with_key("a", max_streams=1)
    async with client(env) as c:
        assert (await c.get("/livez")).status_code == 200
        assert (await c.get("/readyz")).json() == {"postgres": True, "redis": True}
        await c.post("/v1/chat/completions", json=chat(), headers=auth(key))
        text = (await c.get("/metrics")).text
    assert 'llmfleet_gateway_requests_total{model="llama-3.1-8b-instruct",status="200"} 1.0' in text
    assert "llmfleet_gateway_asyncio_tasks" in text
    # Queue wait as the orchestrator reported it in its answer's header, not the time to its answer.
    reported = float(env.dispatcher.answers[0][QUEUE_WAIT_HEADER])
    assert sample(text, f'llmfleet_gateway_queue_wait_seconds_sum{{model="{MODEL}"}}') == reported
    assert 'llmfleet_gateway_dispatch_seconds_count{model="llama-3.1-8b-instruct"} 1.0' in text


def sample(text: str, series: str) -> float:
    [value] = [line[len(series) :].strip() for line in text.splitlines() if line.startswith(series + " ")]
    return float(value)


async def test_node_admin_routes(env: GatewayEnv) -> None:
    """Against the real node store (PostgreSQL and Redis)."""
    h = env.admin_headers()
    async with client(env) as c:
        r = await c.post(
            "/admin/nodes", json={"node_id": "gpu-1", "location": "onprem", "models": [MODEL]}, headers=h
        )
        assert r.status_code == 201
        created = r.json()
        token = created.pop("token")
        assert created == {"node_id": "gpu-1", "location": "onprem", "kind": "node", "models": [MODEL]}
        assert token.startswith("nt-lf")  # the secret, shown once
        pool = await c.post(
            "/admin/nodes",
            json={"node_id": "eks", "location": "cloud", "pool": True, "models": [MODEL]},
            headers=h,
        )
        assert pool.status_code == 201
        assert pool.json()["kind"] == "pool"
        not_bool = await c.post(
            "/admin/nodes", json={"node_id": "x", "pool": "yes", "models": [MODEL]}, headers=h
        )
        assert not_bool.status_code == 400
        assert not_bool.json()["error"]["param"] == "pool"
        bad = await c.post("/admin/nodes", json={"node_id": "../x", "location": "onprem"}, headers=h)
        assert bad.json()["error"]["param"] == "node_id"
        listed = (await c.get("/admin/nodes", headers=h)).json()["data"]
        assert [(n["node_id"], n["kind"]) for n in listed if n["node_id"] != env.fleet.node_id] == [
            ("eks", "pool"),
            ("gpu-1", "node"),
        ]
        assert (await c.delete("/admin/nodes/gpu-1", headers=h)).status_code == 200
        assert (await c.delete("/admin/nodes/gpu-1", headers=h)).status_code == 404


@pytest.mark.parametrize("limit", ["key", "team"])
async def test_max_streams_retry_after_is_when_a_slot_may_free_not_a_minute(
    migrated_db_url: str, redis_url: str, limit: str
) -> None:
    """Issue 27 item 10: a `max_streams` 429 said `Retry-After: 60` (the slot lease, capped) even
    when the running stream ended two seconds later. A slot frees whenever a stream ends, so the
    hint is 1 s, and a retry after it succeeds once the stream has ended."""
    async with gateway_env(migrated_db_url, redis_url, serve=True) as e:
        team_id, key = await e.team_with_key("a", **({"max_streams": 1} if limit == "key" else {}))
        if limit == "team":
            await e.deps.teams.set_sharing(team_id, max_streams=1)
        await e.fleet.pause()  # the engine holds the first stream, and with it the slot
        assert e.fleet.engine is not None
        async with httpx.AsyncClient(base_url=e.base_url, timeout=30) as c:
            first = asyncio.create_task(
                c.post("/v1/chat/completions", json=chat(stream=True), headers=auth(key))
            )
            deadline = time.monotonic() + 10
            while e.fleet.engine.busy() == 0:  # the first stream reached the engine: it holds the slot
                assert time.monotonic() < deadline, "the first stream never reached the engine"
                assert not first.done(), first.result().text
                await asyncio.sleep(0.01)
            refused = await c.post("/v1/chat/completions", json=chat(), headers=auth(key))
            assert refused.status_code == 429
            assert refused.json()["error"]["code"] == (
                "max_streams" if limit == "key" else "team_max_streams"
            )
            assert refused.headers["retry-after"] == "1"
            await e.fleet.resume()
            assert (await first).status_code == 200
            deadline = time.monotonic() + 10
            while True:  # the slot is released as the first stream's cleanup ends
                again = await c.post("/v1/chat/completions", json=chat(), headers=auth(key))
                if again.status_code == 200:
                    break
                assert again.status_code == 429, again.text
                assert time.monotonic() < deadline, "the slot was never released"
                await asyncio.sleep(0.05)
