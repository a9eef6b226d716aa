"""The console's guardrail decisions panel (apps/gateway/console/guardrails.py) in-process (httpx ASGI) on
real PostgreSQL and Redis, with real decisions made by the gateway in front of the real platform
(`tests/fleet.py`): a team policy that redacts, blocks and flags prompts and redacts the engine's own
answer. The counter itself: tests/integration/test_guardrail_counts.py."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from apps.core.guardrails.counts import DecisionCounts
from tests.gateway_env import GatewayEnv, gateway_env
from tests.integration.console_client import signin
from tests.integration.gateway_fixtures import client

pytestmark = pytest.mark.timeout(120)

MODEL = "llama-3.1-8b-instruct"
SSN = "123-45-6789"
STORY = "tell me a story"
FLAGGED = "write to jane.doe@example.com, born on 03/04/1980"  # an email redacted, a birth date flagged
TWO = "write to a.b@example.com and c.d@example.com"  # two emails redacted
CELLS = ("direction", "check", "action", "count")


@pytest.fixture
async def env(migrated_db_url: str, redis_url: str) -> AsyncIterator[GatewayEnv]:
    # Counting is bounded (0.25 s by default) and dropped past it: a pause of the loaded test machine
    # must not drop the counts this test then looks for.
    async with gateway_env(
        migrated_db_url, redis_url, refusal_count_timeout_s=5.0, guardrail_count_timeout_s=5.0
    ) as e:
        yield e


async def chat(c: httpx.AsyncClient, key: str, text: str, *, stream: bool = False) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 12,
        "seed": 7,
        "temperature": 0,
        "stream": stream,
    }
    return await c.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})


def answer(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    if r.headers["content-type"].startswith("application/json"):
        return str(r.json()["choices"][0]["message"]["content"])
    deltas = re.findall(r'"content":"((?:[^"\\]|\\.)*)"', r.text)
    return "".join(deltas)


def rows(page: str) -> dict[str, dict[str, str]]:
    """The panel's rows by id (`guardrail-<[team-]direction-check-action>`), their cells by class."""
    found = {}
    for row_id, cells in re.findall(r'<tr id="guardrail-([^"]+)"[^>]*>(.*?)</tr>', page, re.S):
        found[row_id] = dict(re.findall(r'<td class="gr-([a-z]+)">([^<]*)</td>', cells))
    return found


def metric(env: GatewayEnv, team: int, direction: str, check: str, action: str) -> int:
    labels = {"team": str(team), "direction": direction, "check": check, "action": action}
    return int(env.deps.registry.get_sample_value("llmfleet_gateway_guardrail_decisions_total", labels) or 0)


async def team_page(c: httpx.AsyncClient, path: str, wanted: str, timeout_s: float = 20) -> str:
    """The page once its panel's total reads `wanted`: a streamed answer's decisions are counted at the
    request's end, which may come a moment after its last byte."""
    deadline = time.monotonic() + timeout_s
    while True:
        page = await c.get(path)
        assert page.status_code == 200, page.text
        total = rows(page.text).get("total", {}).get("count")
        if total == wanted:
            return page.text
        assert time.monotonic() < deadline, f"the panel's total is {total}, wanted {wanted}"
        await asyncio.sleep(0.02)  # polled with a deadline: the count has no event to wait on


async def decide(env: GatewayEnv, c: httpx.AsyncClient, team: int, key: str) -> tuple[int, dict[str, int]]:
    """Real decisions for `team`: the engine's answer is read first without a policy, and a word of it
    becomes the output check's pattern. Returns how many times the answers were redacted and the
    expected rows."""
    plain = answer(await chat(c, key, STORY))
    word = max(re.findall(r"[A-Za-z]{3,}", plain), key=plain.count)
    policy: dict[str, Any] = {
        "input": [
            {"detector": "ssn", "action": "block"},
            {"detector": "email", "action": "redact"},
            {"detector": "dob", "action": "flag"},
        ],
        "output": [{"detector": "record", "action": "redact"}],
        "patterns": [{"name": "record", "pattern": rf"\b{word}\b"}],
    }
    saved = await c.put(f"/admin/teams/{team}/guardrails", json=policy, headers=env.admin_headers())
    assert saved.status_code == 200, saved.text
    redacted = answer(await chat(c, key, STORY)).count("[REDACTED:RECORD]")
    redacted += answer(await chat(c, key, FLAGGED)).count("[REDACTED:RECORD]")
    redacted += answer(await chat(c, key, TWO, stream=True)).count("[REDACTED:RECORD]")
    blocked = await chat(c, key, f"my SSN is {SSN}")
    assert (blocked.status_code, blocked.json()["error"]["code"]) == (400, "guardrail_blocked")
    assert redacted >= 1  # the story's word, in the same story (the same prompt and seed: the same words)
    expected = {
        "input-dob-flag": 1,
        "input-email-redact": 3,
        "input-ssn-block": 1,
        "output-record-redact": redacted,
    }
    return redacted, expected


async def test_the_team_view_shows_its_real_decisions_and_another_team_none(env: GatewayEnv) -> None:
    alpha, key = await env.team_with_key("alpha", rpm=100)
    other_key, _ = await env.deps.keys.create(team=alpha, name="idle")
    await env.team_with_key("beta")
    async with client(env) as c:
        redacted, expected = await decide(env, c, alpha, key)
    total = sum(expected.values())
    async with client(env) as c:
        await signin(c, env.issuer.mint("alice", team="alpha"))
        page = await team_page(c, "/console/team", str(total))
        found = rows(page)
        assert {k: int(v["count"]) for k, v in found.items() if k != "total"} == expected
        for row_id, cells in found.items():
            if row_id != "total":
                assert set(cells) == set(CELLS)
                assert "-".join(cells[k] for k in CELLS[:3]) == row_id
                # The console's counts are the metric's: the same decisions, counted once each.
                assert int(cells["count"]) == metric(env, alpha, *row_id.split("-"))
        summary = re.search(r'id="guardrails-summary">(.*?)</p>', page, re.S)
        assert summary is not None
        assert re.sub(r"<[^>]+>", "", summary.group(1)) == f"{3 + redacted} redacted · 1 blocked · 1 flagged"
        for secret in (SSN, "jane.doe@example.com", "a.b@example.com", "03/04/1980"):
            assert secret not in page  # counts only: nothing a check matched
        # Decisions are not per model: the model filter leaves the panel as it is, and says so.
        filtered = (await c.get("/console/team?model=qwen2.5-32b-instruct")).text
        assert rows(filtered)["total"]["count"] == str(total)
        assert "decisions are not counted per model" in filtered
        # The range applies: days with none, and days no longer kept.
        old = (await c.get("/console/team?from=2020-01-01&to=2020-01-31")).text
        assert 'id="guardrails-none"' in old
        assert 'id="guardrails-kept"' in old
        assert 'id="guardrails-kept"' not in page
    async with client(env) as c:  # a key-scoped session: the team's counts, and the page says so
        await signin(c, other_key)
        page = await team_page(c, "/console/team", str(total))
        assert "not only this key's: decisions are counted per team" in page
    async with client(env) as c:  # another team sees none of alpha's
        await signin(c, env.issuer.mint("bob", team="beta"))
        page = (await c.get("/console/team")).text
        assert 'id="guardrails-none"' in page
        assert rows(page) == {}
        assert (await c.get("/console/admin")).headers["location"] == "/console/signin"
    async with client(env) as c:  # no session: the sign-in page, nothing else
        for path in ("/console/team", "/console/admin"):
            r = await c.get(path)
            assert (r.status_code, r.headers["location"]) == (303, "/console/signin")


async def test_the_admin_view_shows_each_teams_decisions(env: GatewayEnv) -> None:
    alpha, key = await env.team_with_key("alpha", rpm=100)
    beta, beta_key = await env.team_with_key("beta", rpm=100)
    async with client(env) as c:
        _, expected = await decide(env, c, alpha, key)
        policy = {"input": [{"detector": "ssn", "action": "block"}]}
        saved = await c.put(f"/admin/teams/{beta}/guardrails", json=policy, headers=env.admin_headers())
        assert saved.status_code == 200, saved.text
        for _ in range(2):
            assert (await chat(c, beta_key, f"SSN {SSN}")).status_code == 400
    total = sum(expected.values()) + 2
    async with client(env) as c:
        await signin(c, env.admin_token)
        page = await team_page(c, "/console/admin", str(total))
        found = rows(page)
        assert {k: int(v["count"]) for k, v in found.items() if k != "total"} == {
            **{f"{alpha}-{k}": n for k, n in expected.items()},
            f"{beta}-input-ssn-block": 2,
        }
        assert {v["team"] for k, v in found.items() if k != "total"} == {"alpha", "beta"}
        assert list(found)[-2] == f"{beta}-input-ssn-block"  # in the teams' name order


async def test_a_redis_that_does_not_answer_changes_no_answer_and_the_page_says_so(env: GatewayEnv) -> None:
    alpha, key = await env.team_with_key("alpha", rpm=100)
    down = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    env.deps.guardrail_counts = DecisionCounts(down, env.deps.clock)
    try:
        async with client(env) as c:
            policy = {
                "input": [{"detector": "ssn", "action": "block"}, {"detector": "email", "action": "redact"}]
            }
            saved = await c.put(f"/admin/teams/{alpha}/guardrails", json=policy, headers=env.admin_headers())
            assert saved.status_code == 200, saved.text
            assert (await chat(c, key, f"SSN {SSN}")).status_code == 400
            assert answer(await chat(c, key, TWO))  # answered as ever, redacted as ever
            sent = env.dispatcher.requests[-1].body["messages"][0]["content"]
            assert sent == "write to [REDACTED:EMAIL] and [REDACTED:EMAIL]"
            errors = env.deps.registry.get_sample_value("llmfleet_gateway_redis_errors_total")
            assert errors == 2  # each request's batch, dropped
            await signin(c, env.issuer.mint("alice", team="alpha"))
            page = await c.get("/console/team")
            assert page.status_code == 200
            assert 'id="guardrails-unavailable"' in page.text
            assert 'id="usage-table"' in page.text  # the rest of the page as always
    finally:
        await down.aclose()
