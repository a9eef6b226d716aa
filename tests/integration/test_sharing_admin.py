"""The sharing model through the gateway (real PostgreSQL and Redis, the real platform behind it): team
weights and key classes in the admin API (bad input is a 400 with `param`), both carried to the
orchestrator with the dispatch (keys and JWTs), and `GET /admin/queues` over Redis."""

from __future__ import annotations

import json
import time

import pytest

from apps.core.fairboard import QUEUE_KEY, SVC_KEY
from tests.gateway_env import GatewayEnv
from tests.integration.gateway_fixtures import client, gateway  # noqa: F401 (fixture)

MODEL = "llama-3.1-8b-instruct"
BIG = "qwen2.5-32b-instruct"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_weights_and_classes_reach_the_dispatch(gateway: GatewayEnv) -> None:  # noqa: F811
    env, h = gateway, gateway.admin_headers()
    async with client(env) as c:
        r = await c.post("/admin/teams", json={"name": "research", "weight": 2.5, "credits": 10}, headers=h)
        assert r.status_code == 201
        assert r.json()["weight"] == 2.5
        r = await c.post("/admin/keys", json={"team": "research", "priority_class": "batch"}, headers=h)
        assert r.status_code == 201
        assert r.json()["priority_class"] == "batch"
        batch_key = r.json()["key"]
        r = await c.post("/admin/keys", json={"team": "research"}, headers=h)
        assert r.json()["priority_class"] == "interactive"
        interactive_key = r.json()["key"]
        assert (await c.post("/v1/chat/completions", json=CHAT, headers=auth(batch_key))).status_code == 200
        assert (
            await c.post("/v1/chat/completions", json=CHAT, headers=auth(interactive_key))
        ).status_code == 200
        # A JWT's class comes from its claim; the team's weight from the ledger.
        token = env.issuer.mint("u", team="research", extra={"priority_class": "batch"})
        assert (await c.post("/v1/chat/completions", json=CHAT, headers=auth(token))).status_code == 200
        r = await c.post("/admin/teams/sharing", json={"team": "research", "weight": 4}, headers=h)
        assert r.status_code == 200
        assert r.json()["weight"] == 4.0
        assert [t["weight"] for t in (await c.get("/admin/teams", headers=h)).json()["data"]] == [4.0]
    sent = [(d.team_weight, d.priority_class.value) for d in env.dispatcher.requests]
    assert sent == [(2.5, "batch"), (2.5, "interactive"), (2.5, "batch")]
    # A client cannot set its own engine priority: the field is dropped (the orchestrator sets it).
    assert all("priority" not in d.body for d in env.dispatcher.requests)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/admin/teams", {"name": "x", "weight": -1}, "weight"),
        ("/admin/teams", {"name": "x", "weight": 0}, "weight"),
        ("/admin/teams", {"name": "x", "weight": "heavy"}, "weight"),
        ("/admin/teams/sharing", {"team": "nobody", "weight": 2}, "team"),
        ("/admin/teams/sharing", {"team_id": 999999, "weight": 2}, "team"),
        ("/admin/teams/sharing", {"team": "ml", "weight": -3}, "weight"),
        ("/admin/teams/sharing", {"team": "ml"}, "weight"),
        ("/admin/keys", {"team": "ml", "priority_class": "urgent"}, "priority_class"),
        ("/admin/keys", {"team": "ml", "priority_class": 1}, "priority_class"),
    ],
)
async def test_bad_sharing_input_is_400_with_param(
    gateway: GatewayEnv,  # noqa: F811
    path: str,
    body: dict[str, object],
    param: str,
) -> None:
    h = gateway.admin_headers()
    async with client(gateway) as c:
        assert (await c.post("/admin/teams", json={"name": "ml"}, headers=h)).status_code == 201
        r = await c.post(path, json=body, headers=h)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param
        # Nothing changed.
        teams = (await c.get("/admin/teams", headers=h)).json()["data"]
        assert [(t["name"], t["weight"]) for t in teams] == [("ml", 1.0)]


async def test_jwt_with_an_unknown_class_is_refused(gateway: GatewayEnv) -> None:  # noqa: F811
    await gateway.deps.teams.create_team("ml")
    token = gateway.issuer.mint("u", team="ml", extra={"priority_class": "urgent"})
    async with client(gateway) as c:
        r = await c.post("/v1/chat/completions", json=CHAT, headers=auth(token))
    assert r.status_code == 401
    assert "priority_class" in r.json()["error"]["message"]
    assert gateway.dispatcher.requests == []


async def test_admin_queues_sums_the_replicas_lanes(gateway: GatewayEnv) -> None:  # noqa: F811
    # The 32B: no replica of the fleet behind this gateway serves it, so r1 and r2 are its only lanes.
    redis, now = gateway.redis, time.time()
    lanes = lambda at, n: json.dumps(  # noqa: E731
        {"at": at, "lanes": [{"class": "interactive", "team_id": 7, "waiting": n, "oldest_wait_s": n / 10}]}
    )
    await redis.hset(QUEUE_KEY.format(model=BIG), mapping={"r1": lanes(now, 3), "r2": lanes(now, 5)})
    await redis.hset(QUEUE_KEY.format(model=BIG), "gone", lanes(now - 600, 100))  # a dead replica
    await redis.hset(SVC_KEY.format(model=BIG), mapping={"7": 1200.0, "8": 300.0})
    async with client(gateway) as c:
        r = await c.get("/admin/queues", headers=gateway.admin_headers())
        assert r.status_code == 200
        assert (await c.get("/admin/queues", headers=auth("sk-lf-nope"))).status_code in (401, 403)
    board = {m["model"]: m for m in r.json()["data"]}[BIG]
    assert board["replicas"] == 2
    assert board["waiting"] == 8
    assert board["teams"] == [
        {
            "team_id": 7,
            "served_tokens": 1200.0,
            "classes": [{"team_id": 7, "class": "interactive", "waiting": 8, "oldest_wait_s": 0.5}],
        },
        {"team_id": 8, "served_tokens": 300.0, "classes": []},
    ]
