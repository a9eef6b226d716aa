"""Issue 21, input: the inputs that answered 500 with a traceback on main, through the real gateway
(real PostgreSQL and Redis): each is now a 400 with `param`, and nothing is reserved or dispatched."""

from __future__ import annotations

import pytest

from tests.gateway_env import GatewayEnv
from tests.integration.gateway_fixtures import client, gateway

__all__ = ["gateway"]  # the fixture, imported for pytest

MODEL = "llama-3.1-8b-instruct"


@pytest.fixture
def env(gateway: GatewayEnv) -> GatewayEnv:
    return gateway


@pytest.mark.parametrize(
    ("param", "value"), [("from", "1e20"), ("from", "inf"), ("to", "nan"), ("to", "-1e300")]
)
async def test_usage_times_out_of_range_are_400(env: GatewayEnv, param: str, value: str) -> None:
    _, key = await env.team_with_key("a")
    async with client(env) as c:
        r = await c.get("/v1/usage", params={param: value}, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"team": "a", "expires_at": "1e20"}, "expires_at"),
        ({"team": "a", "expires_at": 1e300}, "expires_at"),
        ({"team": "a", "expires_at": "0001-01-01T00:00:00+01:00"}, "expires_at"),
        ({"team": "a", "rpm": 2**40}, "rpm"),
        ({"team": "a", "tokens_per_day": 2**70}, "tokens_per_day"),
    ],
)
async def test_admin_key_fields_out_of_range_are_400(
    env: GatewayEnv, body: dict[str, object], param: str
) -> None:
    await env.team_with_key("a")
    async with client(env) as c:
        r = await c.post("/admin/keys", json=body, headers=env.admin_headers())
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize("amount", ["Infinity", "1e999999999", 10**30])
async def test_admin_credit_amounts_out_of_range_are_400(env: GatewayEnv, amount: object) -> None:
    await env.team_with_key("a")
    async with client(env) as c:
        r = await c.post("/admin/credits", json={"team": "a", "amount": amount}, headers=env.admin_headers())
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "amount"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model":"' + MODEL.encode() + b'","messages":' + b"[" * 50_000 + b"]" * 50_000 + b"}",
        b'{"model":"' + MODEL.encode() + b'","messages":[{"role":"user","content":"\\ud800"}]}',
        b'{"model":"'
        + MODEL.encode()
        + b'","messages":[{"role":"user","content":"hi"}],"x":'
        + b'{"a":' * 40
        + b"1"
        + b"}" * 40
        + b"}",
    ],
    ids=["deep-array", "lone-surrogate", "deep-object"],
)
async def test_chat_bodies_that_gave_500_are_400(env: GatewayEnv, raw: bytes) -> None:
    team_id, key = await env.team_with_key("a")
    async with client(env) as c:
        r = await c.post(
            "/v1/chat/completions",
            content=raw,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
    assert r.status_code == 400, r.text
    assert "param" in r.json()["error"]
    assert env.dispatcher.requests == []
    async with env.pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM usage_ledger WHERE team_id = %s", (team_id,))
        row = await cur.fetchone()
    assert row == (0,)


async def test_admin_bodies_nested_too_deeply_are_400(env: GatewayEnv) -> None:
    async with client(env) as c:
        r = await c.post(
            "/admin/teams", content=b'{"a":' * 100_000 + b"1" + b"}" * 100_000, headers=env.admin_headers()
        )
    assert r.status_code == 400, r.text


async def test_tool_schemas_pass_and_inward_image_urls_are_refused(env: GatewayEnv) -> None:
    """Issue 27 item 8, through the gateway: a tool whose parameters are named `url`, `image`,
    `src`, `href` with a `$ref` is served; an image part pointing inward is a 400 before anything is
    reserved or dispatched."""
    schema = {
        "type": "object",
        "properties": {
            "url": {"type": "string"},
            "image": {"type": "string"},
            "src": {"type": "string"},
            "href": {"type": "string"},
            "where": {"$ref": "#/$defs/point"},
        },
        "$defs": {"point": {"type": "object"}},
    }
    tools = [{"type": "function", "function": {"name": "fetch", "parameters": schema}}]
    team_id, key = await env.team_with_key("a")
    auth = {"Authorization": f"Bearer {key}"}
    inward = [{"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest/"}}]
    async with client(env) as c:
        ok = await c.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": tools},
            headers=auth,
        )
        refused = await c.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": inward}], "tools": tools},
            headers=auth,
        )
    assert ok.status_code == 200, ok.text
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "messages.0.content.0.image_url.url"
    assert len(env.dispatcher.requests) == 1
    assert env.dispatcher.requests[0].body["tools"] == tools
    async with env.pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM usage_ledger WHERE team_id = %s", (team_id,))
        assert await cur.fetchone() == (1,)
