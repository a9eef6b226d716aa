"""Per-key caps (`api_keys.max_tokens`, `.max_context`) and the admin API's strict bodies, through
the gateway app against real PostgreSQL and Redis: set on create and patch, validated (400 with
`param`), enforced on chat (400 with `param`, nothing reserved, no slot held)."""

from __future__ import annotations

import re

import httpx
import psycopg
import pytest

from apps.core.db.migrate import MIGRATIONS_DIR
from tests.gateway_env import GatewayEnv
from tests.integration.console_client import signin
from tests.integration.gateway_fixtures import client, gateway

__all__ = ["gateway"]  # the fixture, imported for pytest

MODEL = "llama-3.1-8b-instruct"
HI = [{"role": "user", "content": "hi"}]  # the gateway's prompt bound: 56 tokens


@pytest.fixture
def env(gateway: GatewayEnv) -> GatewayEnv:
    return gateway


async def _open_reservations(env: GatewayEnv) -> int:
    async with env.pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM usage_ledger WHERE status = 'reserved'")
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_admin_creates_lists_and_patches_caps(env: GatewayEnv) -> None:
    await env.deps.teams.create_team("ml")
    h = env.admin_headers()
    async with client(env) as c:
        r = await c.post("/admin/keys", json={"team": "ml", "max_tokens": 64, "max_context": 512}, headers=h)
        assert r.status_code == 201, r.text
        created = r.json()
        assert (created["max_tokens"], created["max_context"]) == (64, 512)
        listed = (await c.get("/admin/keys", params={"team": "ml"}, headers=h)).json()["data"]
        assert (listed[0]["max_tokens"], listed[0]["max_context"]) == (64, 512)
        patched = await c.patch(
            f"/admin/keys/{created['id']}", json={"max_tokens": 32, "max_context": None}, headers=h
        )
        assert patched.status_code == 200, patched.text
        assert (patched.json()["max_tokens"], patched.json()["max_context"], patched.json()["rpm"]) == (
            32,
            None,
            None,
        )
        missing = await c.patch("/admin/keys/999999", json={"max_tokens": 1}, headers=h)
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "key_not_found"
        # The patch is what the key uses at once (this replica drops its cache entry).
        auth = {"Authorization": f"Bearer {created['key']}"}
        over = await c.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": HI, "max_tokens": 33}, headers=auth
        )
        assert over.status_code == 400, over.text
        assert over.json()["error"]["param"] == "max_tokens"


@pytest.mark.parametrize(
    ("path", "method", "body", "param"),
    [
        ("/admin/keys", "POST", {"team": "ml", "max_tokens": 0}, "max_tokens"),
        ("/admin/keys", "POST", {"team": "ml", "max_context": "4k"}, "max_context"),
        ("/admin/keys", "POST", {"team": "ml", "max_context": 2**40}, "max_context"),
        ("/admin/keys", "POST", {"team": "ml", "max_stream": 2}, "max_stream"),  # a typo: no key without it
        ("/admin/keys", "POST", {"team": "ml", "rpm": 5, "tokens_per_dya": 9}, "tokens_per_dya"),
        ("/admin/teams", "POST", {"name": "x", "credit": 5}, "credit"),
        (
            "/admin/credits",
            "POST",
            {"team": "ml", "amount": 1, "amout_microcredits": 5},
            "amout_microcredits",
        ),
        ("/admin/nodes", "POST", {"node_id": "n", "models": [MODEL], "locaton": "cloud"}, "locaton"),
        ("/admin/keys/{id}", "PATCH", {"max_token": 5}, "max_token"),
        ("/admin/keys/{id}", "PATCH", {"team": "other"}, "team"),
        ("/admin/keys/{id}", "PATCH", {"max_tokens": -1}, "max_tokens"),
    ],
)
async def test_admin_rejects_unknown_fields_and_bad_caps(
    env: GatewayEnv, path: str, method: str, body: dict[str, object], param: str
) -> None:
    team_id, _ = await env.team_with_key("ml", credits=0)
    [key] = await env.deps.keys.list_keys("ml")
    async with client(env) as c:
        r = await c.request(method, path.format(id=key.id), json=body, headers=env.admin_headers())
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param
        assert r.json()["error"]["type"] == "invalid_request_error"
    assert [k.id for k in await env.deps.keys.list_keys("ml")] == [key.id]  # nothing created
    assert [t.name for t in await env.deps.teams.list_teams()] == ["ml"]
    unchanged = (await env.deps.keys.list_keys(team_id))[0]
    assert (unchanged.max_tokens, unchanged.max_context) == (None, None)


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"max_tokens": 65}, "max_tokens", "invalid_request"),
        ({"max_completion_tokens": 100}, "max_completion_tokens", "invalid_request"),
        (
            {"max_tokens": 64, "messages": [{"role": "user", "content": "x" * 420}]},
            "messages",
            "context_length_exceeded",
        ),
        ({"messages": [{"role": "user", "content": "x" * 600}]}, "messages", "context_length_exceeded"),
    ],
)
async def test_chat_over_a_keys_caps_is_400_and_holds_nothing(
    env: GatewayEnv, body: dict[str, object], param: str, code: str
) -> None:
    _, key = await env.team_with_key("ml", max_tokens=64, max_context=512, max_streams=1)
    auth = {"Authorization": f"Bearer {key}"}
    async with client(env) as c:
        r = await c.post("/v1/chat/completions", json={"model": MODEL, "messages": HI, **body}, headers=auth)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error")
        assert env.dispatcher.requests == []
        assert await _open_reservations(env) == 0
        # The one stream slot is free: a request within the caps passes.
        ok = await c.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": HI, "max_tokens": 64}, headers=auth
        )
        assert ok.status_code == 200, ok.text


async def test_without_max_tokens_the_default_is_clamped_to_the_caps(env: GatewayEnv) -> None:
    _, capped = await env.team_with_key("ml", max_tokens=16)
    _, tight = await env.team_with_key("dl", max_context=66)  # 56 for the prompt bound leaves 10
    async with client(env) as c:
        for key, expected in ((capped, 16), (tight, 10)):
            r = await c.post(
                "/v1/chat/completions",
                # `ignore_eos`: the engine answers the whole budget, so its length is the cap's.
                json={"model": MODEL, "messages": HI, "ignore_eos": True},
                headers={"Authorization": f"Bearer {key}"},
            )
            assert r.status_code == 200, r.text
            assert env.dispatcher.requests[-1].budget.max_tokens == expected
            assert env.dispatcher.requests[-1].max_completion_tokens == expected  # what was reserved
            assert r.json()["usage"]["completion_tokens"] == expected


async def test_the_console_creates_and_lists_caps(env: GatewayEnv) -> None:
    await env.team_with_key("alpha", max_tokens=48, max_context=777)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=env.app), base_url="http://gw") as c:
        await signin(c, env.issuer.mint("alice", team="alpha"))
        page = (await c.get("/console/team")).text
        assert "<td>48 / 777</td>" in page
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf
        form = {"csrf": csrf.group(1), "name": "capped", "max_tokens": "32", "max_context": "2048"}
        created = await c.post("/console/team/keys", data=form)
        assert created.status_code == 201, created.text
        assert "<td>32 / 2048</td>" in created.text
    new = next(k for k in await env.deps.keys.list_keys("alpha") if k.name == "capped")
    assert (new.max_tokens, new.max_context) == (32, 2048)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=env.app), base_url="http://gw") as admin:
        await signin(admin, env.admin_token)
        assert "<td>32 / 2048</td>" in (await admin.get("/console/admin")).text


def test_migration_0006_applies_twice_and_keeps_its_checks(migrated_db_url: str) -> None:
    sql = (MIGRATIONS_DIR / "0006_key_caps.sql").read_text(encoding="utf-8")
    with psycopg.connect(migrated_db_url, autocommit=True) as conn:
        conn.execute(sql.encode())  # a second time: no error
        team = conn.execute("INSERT INTO teams (name) VALUES ('m6') RETURNING id").fetchone()
        assert team is not None
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                "INSERT INTO api_keys (team_id, hash, prefix, max_tokens) VALUES (%s, 'h', 'p', 0)",
                (team[0],),
            )
