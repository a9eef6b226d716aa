"""The console's response cache panel (apps/gateway/console/cache.py) in-process (httpx ASGI) on real
PostgreSQL and Redis, with real hits and misses through the gateway in front of the real platform
(`tests/fleet.py`). The rollup it reads (migration 0018) against the raw ledger: tests/integration/test_usage_rollups.py."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import httpx
import pytest

from apps.gateway.console.cache import gpu_time
from apps.gateway.console.views import credits
from tests.chaos.helpers import metric_sum
from tests.fleet import EMBED_MODEL, FleetSetup
from tests.gateway_env import GatewayEnv, gateway_env
from tests.integration.console_client import signin
from tests.integration.gateway_fixtures import client, gateway

__all__ = ["gateway"]  # the fixture, imported for pytest

MODEL = "llama-3.1-8b-instruct"
QUESTION = "What is the capital city of France?"
OTHER = "What is the capital city of Spain?"
CELLS = ("label", "hits", "misses", "rate", "credits", "tokens", "gpu", "lookups", "lookup-credits")


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": text}]


async def chat(c: httpx.AsyncClient, key: str, text: str, temperature: float = 0.0) -> str:
    """One request (exactly 4 completion tokens when the engine answers); its `x-llmfleet-cache`."""
    body = {
        "model": MODEL,
        "messages": ask(text),
        "max_tokens": 4,
        "ignore_eos": True,
        "temperature": temperature,
    }
    r = await c.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    return r.headers.get("x-llmfleet-cache", "")


async def enable(c: httpx.AsyncClient, env: GatewayEnv, team: int, policy: dict[str, Any]) -> None:
    r = await c.put(f"/admin/teams/{team}/cache", json=policy, headers=env.admin_headers())
    assert r.status_code == 200, r.text


async def stored(
    c: httpx.AsyncClient, env: GatewayEnv, team: int, entries: int, timeout_s: float = 20
) -> None:
    """Until the team's cache holds `entries` (a miss's answer is written after its response ended,
    in the background), read through the admin API's stats."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = await c.get(f"/admin/teams/{team}/cache/stats", headers=env.admin_headers())
        assert r.status_code == 200, r.text
        if r.json()["entries"] >= entries:
            return
        assert time.monotonic() < deadline, f"team {team}'s cache: {r.json()}, wanted {entries} entries"
        await asyncio.sleep(0.02)  # polled with a deadline: the write has no event to wait on


def cache_row(page: str, key: str) -> dict[str, str]:
    """The panel's row `cache-<key>` (a model, a team id, or `total`), its cells by class."""
    found = re.search(rf'<tr id="cache-{re.escape(key)}"[^>]*>(.*?)</tr>', page, re.S)
    assert found, f"no cache row {key!r} on the page"
    cells = dict(re.findall(r'<td class="cache-([a-z-]+)"[^>]*>([^<]*)</td>', found.group(1)))
    assert set(cells) == set(CELLS), cells
    return cells


async def hit_rows(env: GatewayEnv, team: int) -> tuple[int, int, int]:
    """(hits, their completion tokens, their cost) straight from the ledger."""
    async with env.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*), COALESCE(SUM(completion_tokens), 0), COALESCE(SUM(cost_microcredits), 0)"
            " FROM usage_ledger WHERE team_id = %s AND cache = 'hit' AND status = 'settled'",
            (team,),
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


async def test_the_team_and_admin_views_show_the_cache_after_real_hits_and_misses(
    gateway: GatewayEnv,
) -> None:
    env = gateway
    alpha, key = await env.team_with_key("alpha", rpm=100)
    other_key, _ = await env.deps.keys.create(team=alpha, name="idle")
    beta, beta_key = await env.team_with_key("beta", rpm=100)
    async with client(env) as c:
        await enable(c, env, alpha, {"models": {MODEL: {}}})
        assert await chat(c, key, QUESTION) == "miss"
        await stored(c, env, alpha, 1)
        assert await chat(c, key, QUESTION) == "hit"
        assert await chat(c, key, QUESTION) == "hit"
        assert await chat(c, key, OTHER) == "miss"
        assert await chat(c, key, QUESTION, temperature=0.7) == "bypass"  # counted in neither
        assert await chat(c, beta_key, QUESTION) == ""  # beta has no policy: the cache is not asked
        metrics = (await c.get("/metrics")).text
    await env.settled()
    hits, tokens, cost = await hit_rows(env, alpha)
    assert (hits, tokens) == (2, 8)
    saved = metric_sum(
        metrics, "llmfleet_gateway_cache_saved_gpu_seconds_total", team=str(alpha), model=MODEL
    )
    assert saved > 0

    async with client(env) as c:
        await signin(c, env.issuer.mint("alice", team="alpha"))
        page = (await c.get("/console/team")).text
        for row in (cache_row(page, MODEL), cache_row(page, "total")):
            assert row["hits"] == "2"
            assert row["misses"] == "2"
            assert row["rate"] == "50.0%"
            assert row["credits"] == credits(cost)
            assert row["tokens"] == str(tokens)
            assert row["gpu"] == gpu_time(saved)
            assert row["lookups"] == "0"
        # The GPU time is the gateway counter's, to the microsecond (the same figure from the same tokens).
        assert f'title="{saved:.6f} GPU seconds"' in page
        assert "an estimate, not a measurement" in page
        # The panel follows the usage range and its model filter.
        assert 'id="cache-none"' in (await c.get("/console/team?from=2020-01-01&to=2020-01-31")).text
        assert 'id="cache-none"' in (await c.get("/console/team?model=qwen2.5-32b-instruct")).text
        assert cache_row((await c.get(f"/console/team?model={MODEL}")).text, MODEL)["hits"] == "2"
        bad = await c.get("/console/team?from=2026-03-10&to=2026-03-01")
        assert bad.status_code == 400
        assert 'id="cache-table"' not in bad.text

    async with client(env) as c:  # a key-scoped session: its key's requests only
        await signin(c, other_key)
        assert 'id="cache-none"' in (await c.get("/console/team")).text
    async with client(env) as c:
        await signin(c, key)
        assert cache_row((await c.get("/console/team")).text, "total")["hits"] == "2"
    async with client(env) as c:  # another team sees nothing of alpha's
        await signin(c, env.issuer.mint("bob", team="beta"))
        page = (await c.get("/console/team")).text
        assert 'id="cache-none"' in page
        assert 'id="cache-table"' not in page
        assert (await c.get("/console/admin")).headers["location"] == "/console/signin"

    async with client(env) as c:
        assert (await c.get("/console/team")).headers["location"] == "/console/signin"  # no session
        await signin(c, env.admin_token)
        page = (await c.get("/console/admin")).text
    row = cache_row(page, str(alpha))
    assert (row["label"], row["hits"], row["misses"], row["rate"]) == ("alpha", "2", "2", "50.0%")
    assert (row["credits"], row["tokens"], row["gpu"]) == (credits(cost), str(tokens), gpu_time(saved))
    assert f'id="cache-{beta}"' not in page  # beta's request was not looked up
    assert cache_row(page, "total")["hits"] == "2"


@pytest.mark.timeout(180)
async def test_semantic_lookups_show_with_what_they_cost(vector_db_url: str, redis_url: str) -> None:
    """A near question's embedding (`<request id>:cache-embed`, on the embedding model) is counted as a
    lookup, with its cost, on the embedding model's row; the hit it found on the chat model's."""
    async with gateway_env(vector_db_url, redis_url, fleet=FleetSetup(embed=True)) as env:
        team, key = await env.team_with_key("semantic", rpm=100)
        async with client(env) as c:
            await enable(
                c, env, team, {"models": {MODEL: {"semantic_threshold": 0.9}}, "embedding_model": EMBED_MODEL}
            )
            assert await chat(c, key, QUESTION) == "miss"
            await stored(c, env, team, 1)
            assert await chat(c, key, "what is the capital city of France") == "hit"  # the same words
        await env.settled()
        async with env.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*), SUM(cost_microcredits) FROM usage_ledger"
                " WHERE team_id = %s AND request_id LIKE %s AND status = 'settled' AND model = %s",
                (team, "%:cache-embed", EMBED_MODEL),
            )
            lookups, lookup_cost = await cur.fetchone()  # type: ignore[misc]
        assert lookups == 2  # the miss's question and the near one's
        async with client(env) as c:
            await signin(c, env.issuer.mint("sam", team="semantic"))
            page = (await c.get("/console/team")).text
    chat_row, embed_row, total = (
        cache_row(page, MODEL),
        cache_row(page, EMBED_MODEL),
        cache_row(page, "total"),
    )
    assert (chat_row["hits"], chat_row["misses"], chat_row["lookups"]) == ("1", "1", "0")
    assert (embed_row["hits"], embed_row["misses"], embed_row["rate"]) == ("0", "0", "-")
    assert (embed_row["lookups"], embed_row["lookup-credits"]) == ("2", credits(lookup_cost))
    assert (total["rate"], total["lookups"]) == ("50.0%", "2")
