"""Issue 21, money and tenancy: the gateway against real PostgreSQL and Redis, in front of the real
platform in-process (`tests/fleet.py`).

Each test here failed on main: the reservation covered one choice of `max_tokens` while the body
went to the engine unchanged; `tokens_per_day` counted only settled tokens; an all-digit team
name was read as a team id.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import pytest

from apps.gateway.validate import estimate_prompt_tokens
from tests.gateway_env import GatewayEnv
from tests.integration.gateway_fixtures import client, gateway
from tests.utcdays import tokens_counted

__all__ = ["gateway"]  # the fixture, imported for pytest

MODEL = "llama-3.1-8b-instruct"
MESSAGES = [{"role": "user", "content": "hi"}]


def chat(**extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": MESSAGES, **extra}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def env(gateway: GatewayEnv) -> GatewayEnv:
    return gateway


def worst_case_cost(env: GatewayEnv, completion_tokens: int) -> int:
    return env.deps.ledger.estimate(MODEL, estimate_prompt_tokens(MESSAGES), completion_tokens)  # type: ignore[attr-defined, no-any-return]


async def balance(env: GatewayEnv, team_id: int) -> tuple[int, int]:
    async with env.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT balance_microcredits, reserved_microcredits FROM teams WHERE id = %s", (team_id,)
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def test_n_above_the_stack_bound_is_400_with_param(env: GatewayEnv) -> None:
    _, key = await env.team_with_key("a")
    limit = env.deps.spec.request_limits.max_n
    async with client(env) as c:
        r = await c.post("/v1/chat/completions", json=chat(n=limit + 1, max_tokens=4), headers=auth(key))
        ok = await c.post("/v1/chat/completions", json=chat(n=limit, max_tokens=4), headers=auth(key))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "n"
    assert ok.status_code == 200, ok.text
    assert env.dispatcher.requests[0].body["n"] == limit


async def test_the_worst_case_of_n_choices_must_fit_the_balance_or_402(env: GatewayEnv) -> None:
    one_choice = worst_case_cost(env, 100)
    team_id, key = await env.team_with_key("a", credits=one_choice)
    async with client(env) as c:
        r = await c.post("/v1/chat/completions", json=chat(n=4, max_tokens=100), headers=auth(key))
    assert r.status_code == 402, r.text
    assert env.dispatcher.requests == []
    assert await balance(env, team_id) == (one_choice, 0)  # nothing taken, nothing left reserved


async def test_the_reservation_and_the_engine_get_the_same_effective_max_tokens(env: GatewayEnv) -> None:
    default = env.deps.spec.models[MODEL].serving.default_max_tokens
    team_id, key = await env.team_with_key("a")
    await env.fleet.pause()  # the engine holds the request while its reservation is open
    async with client(env) as c:
        sent = asyncio.ensure_future(
            c.post("/v1/chat/completions", json=chat(n=3, stream=True), headers=auth(key))
        )
        deadline = time.monotonic() + 10
        while not env.dispatcher.requests:  # poll with a deadline: the dispatcher has no event for it
            assert time.monotonic() < deadline, "the request never reached the dispatcher"
            await asyncio.sleep(0.01)
        dreq = env.dispatcher.requests[0]
        # Absent in the client's body: the default, in the budget the agent tells the engine.
        assert "max_tokens" not in dreq.body
        assert (dreq.budget.max_tokens, dreq.budget.n) == (default, 3)
        assert (dreq.max_prompt_tokens, dreq.max_completion_tokens) == (
            estimate_prompt_tokens(MESSAGES),
            3 * default,
        )
        assert (await balance(env, team_id))[1] == worst_case_cost(env, 3 * default)
        await env.fleet.resume()
        r = await sent
    assert r.status_code == 200


async def test_tokens_per_day_counts_requests_in_flight_and_their_worst_case(env: GatewayEnv) -> None:
    started = datetime.now(UTC)
    worst = estimate_prompt_tokens(MESSAGES) + 10
    _, key = await env.team_with_key("a", tokens_per_day=3 * worst)  # room for 3 worst cases
    await env.fleet.pause()  # the admitted requests are held at the engine, their worst case in flight
    async with client(env) as c:
        calls = [
            asyncio.ensure_future(c.post("/v1/chat/completions", json=chat(max_tokens=10), headers=auth(key)))
            for _ in range(10)
        ]
        while sum(t.done() for t in calls) < 7:  # the refused ones answer while the engine is paused
            await asyncio.wait([t for t in calls if not t.done()], return_when=asyncio.FIRST_COMPLETED)
        refused = [t for t in calls if t.done()]
        assert all(t.result().status_code == 429 for t in refused)
        assert all(t.result().json()["error"]["code"] == "tokens_per_day" for t in refused)
        await env.fleet.resume()
        answers = await asyncio.gather(*calls)
    assert sorted(r.status_code for r in answers) == [200] * 3 + [429] * 7
    key_id = env.dispatcher.requests[0].key_id
    await env.settled()
    settled = await tokens_counted(env.redis, key_id, started)
    assert settled <= 3 * worst
    assert await env.redis.hlen(f"tpd:{key_id}:inflight") == 0  # the settles took their entries out


async def test_a_cancelled_request_gives_its_in_flight_tokens_back(env: GatewayEnv) -> None:
    worst = estimate_prompt_tokens(MESSAGES) + 10
    _, key = await env.team_with_key("poor", credits=1, tokens_per_day=worst)  # 402 after admission
    async with client(env) as c:
        r = await c.post("/v1/chat/completions", json=chat(max_tokens=10), headers=auth(key))
    assert r.status_code == 402
    key_id = (await env.deps.keys.list_keys("poor"))[0].id
    assert await env.redis.hlen(f"tpd:{key_id}:inflight") == 0


async def digit_teams(env: GatewayEnv) -> tuple[int, int]:
    """A team whose id is 2 and another one named "2" (whose id is not 2)."""
    first = await env.deps.teams.create_team("alpha")
    second = await env.deps.teams.create_team("beta")
    named = await env.deps.teams.create_team("2")
    assert (first.id, second.id, named.id) == (1, 2, 3)
    return second.id, named.id


async def test_a_jwt_team_claim_is_a_name_even_when_it_is_all_digits(env: GatewayEnv) -> None:
    id_two, named_two = await digit_teams(env)
    await env.deps.teams.add_credits(named_two, 10**9)
    token = env.issuer.mint("u", team="2")
    async with client(env) as c:
        r = await c.post("/v1/chat/completions", json=chat(max_tokens=4), headers=auth(token))
        await env.settled()
        usage = await c.get("/v1/usage", headers=auth(token))
        by_id = env.issuer.mint("v", extra={"team_id": id_two})
        usage_by_id = await c.get("/v1/usage", headers=auth(by_id))
        both = env.issuer.mint("w", team="2", extra={"team_id": id_two})
        refused = await c.get("/v1/usage", headers=auth(both))
        not_int = env.issuer.mint("x", extra={"team_id": "2"})
        refused_str = await c.get("/v1/usage", headers=auth(not_int))
    assert r.status_code == 200, r.text
    assert env.dispatcher.requests[0].team_id == named_two
    assert usage.json()["team"] == "2"
    assert usage.json()["total"]["requests"] == 1
    assert usage_by_id.json()["team"] == "beta"
    assert usage_by_id.json()["total"]["requests"] == 0
    assert refused.status_code == 401
    assert refused_str.status_code == 401


async def test_admin_calls_say_whether_they_mean_a_team_id_or_a_name(env: GatewayEnv) -> None:
    id_two, named_two = await digit_teams(env)
    h = env.admin_headers()
    async with client(env) as c:
        by_name = await c.post("/admin/credits", json={"team": "2", "amount": 1}, headers=h)
        by_id = await c.post("/admin/credits", json={"team_id": 2, "amount": 3}, headers=h)
        key = await c.post("/admin/keys", json={"team": "2"}, headers=h)
        listed = await c.get("/admin/keys", params={"team": "2"}, headers=h)
        listed_id = await c.get("/admin/keys", params={"team_id": "2"}, headers=h)
        ambiguous = await c.post("/admin/credits", json={"team": "2", "team_id": 2, "amount": 1}, headers=h)
        int_name = await c.post("/admin/credits", json={"team": 2, "amount": 1}, headers=h)
        bad_id = await c.get("/admin/keys", params={"team_id": "beta"}, headers=h)
    assert by_name.json()["team_id"] == named_two
    assert by_id.json()["team_id"] == id_two
    assert key.json()["team_id"] == named_two
    assert [k["team_id"] for k in listed.json()["data"]] == [named_two]
    assert listed_id.json()["data"] == []
    for refused, param in ((ambiguous, "team_id"), (int_name, "team"), (bad_id, "team_id")):
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == param
    assert (await env.deps.teams.get_team(named_two)).balance_microcredits == 1_000_000
    assert (await env.deps.teams.get_team(id_two)).balance_microcredits == 3_000_000


@pytest.mark.parametrize("name", ["", "a b", "-lead", "x" * 65, "team/1", "ünï"])
async def test_team_names_are_validated(env: GatewayEnv, name: str) -> None:
    async with client(env) as c:
        r = await c.post("/admin/teams", json={"name": name}, headers=env.admin_headers())
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "name"


async def test_team_names_are_unique_regardless_of_case(env: GatewayEnv) -> None:
    async with client(env) as c:
        first = await c.post("/admin/teams", json={"name": "Team-A"}, headers=env.admin_headers())
        again = await c.post("/admin/teams", json={"name": "team-a"}, headers=env.admin_headers())
    assert first.status_code == 201
    assert again.status_code == 409
    assert again.json()["error"]["param"] == "name"


@pytest.mark.parametrize(
    "shared",
    # Issue 27 item 6: an id shaped like a generated one (`chatcmpl-...`) was not scoped, so team b's
    # 400 `duplicate_request_id` told it that team a had used the id.
    ["shared-req-0001", "chatcmpl-shared0001", "chatcmpl-0123456789abcdef0123456789abcdef"],
)
async def test_client_request_ids_are_scoped_per_team(env: GatewayEnv, shared: str) -> None:
    team_a, key_a = await env.team_with_key("team-a")
    team_b, key_b = await env.team_with_key("team-b")
    rid = {"x-request-id": shared}
    async with client(env) as c:
        a = await c.post("/v1/chat/completions", json=chat(max_tokens=4), headers={**auth(key_a), **rid})
        b = await c.post("/v1/chat/completions", json=chat(max_tokens=4), headers={**auth(key_b), **rid})
        again = await c.post("/v1/chat/completions", json=chat(max_tokens=4), headers={**auth(key_a), **rid})
    assert (a.status_code, b.status_code) == (200, 200), b.text  # b learns nothing about a's id
    assert a.headers["x-request-id"] == b.headers["x-request-id"] == shared
    assert again.status_code == 400  # within one team an id is still used once
    assert again.json()["error"]["code"] == "duplicate_request_id"
    assert len({r.request_id for r in env.dispatcher.requests}) == 2
    async with env.pool.connection() as conn:
        cur = await conn.execute("SELECT team_id, request_id FROM usage_ledger ORDER BY team_id")
        rows = await cur.fetchall()
    # One ledger row per team, each in its team's namespace: billed once each, never twice.
    assert rows == [(team_a, f"t{team_a}/{shared}"), (team_b, f"t{team_b}/{shared}")]
