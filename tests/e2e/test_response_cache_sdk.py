"""The response cache (issue 31 item 2, docs/response-cache.md) with the official `openai` SDK: the
gateway on loopback in front of the real platform in-process (`tests/fleet.py`: orchestrator, agents,
enginesim serving the 8B chat model and the dev stack's embedding model), real PostgreSQL with pgvector
(the test server when it has the extension, else the embedded one `llmfleet dev` runs) and real Redis.

What proves a hit: the engine's own request counter does not move, and the ledger row says `hit`."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import openai
import pytest

from apps.core.ledger.pg import cost_microcredits
from apps.core.spec import load_spec
from apps.enginesim.vectors import cosine, embed
from tests.fleet import EMBED_DIMS, EMBED_MODEL, FleetSetup
from tests.gateway_env import GatewayEnv, gateway_env

pytestmark = pytest.mark.timeout(180)

MODEL = "llama-3.1-8b-instruct"
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 6}
QUESTION = "What is the capital city of France?"
CLOSE = "what is the capital city of France"  # the same words: enginesim's vectors are bags of words
FAR = "What is the capital city of Spain?"
THRESHOLD = 0.9


def sdk(env: GatewayEnv, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=env.base_url + "/v1", api_key=key, max_retries=0, timeout=30)


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": text}]


async def engine_requests(env: GatewayEnv) -> float:
    assert env.fleet.engine is not None
    return await env.fleet.engine.metric("vllm:request_success_total")


async def enable(env: GatewayEnv, team: int, policy: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=env.base_url, headers=env.admin_headers()) as admin:
        return await admin.put(f"/admin/teams/{team}/cache", json=policy)


async def entries(env: GatewayEnv, team: int, at_least: int, timeout_s: float = 20.0) -> int:
    """The team's stored entries, once there are `at_least` (a miss's answer is stored after its
    response finished, in the background)."""
    deadline = time.monotonic() + timeout_s
    while True:
        async with env.pool.connection() as conn:
            cur = await conn.execute("SELECT count(*) FROM response_cache WHERE team_id = %s", (team,))
            row = await cur.fetchone()
        count = int(row[0]) if row else 0
        if count >= at_least:
            return count
        assert time.monotonic() < deadline, f"{count} entries of team {team}, wanted {at_least}"
        await asyncio.sleep(0.02)  # polled with a deadline: the store has no change event


async def ledger(env: GatewayEnv, team: int) -> list[tuple[str, str | None, int, int, int]]:
    await env.settled()
    async with env.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT request_id, cache, prompt_tokens, completion_tokens, cost_microcredits FROM usage_ledger"
            " WHERE team_id = %s AND status = 'settled' AND model = %s ORDER BY id",
            (team, MODEL),
        )
        return [tuple(r) for r in await cur.fetchall()]  # type: ignore[misc]


async def streamed(client: openai.AsyncOpenAI, messages: list[dict[str, str]]) -> tuple[list[Any], str]:
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, stream=True, stream_options={"include_usage": True}, **GREEDY
    )
    chunks = [c async for c in raw.parse()]
    return chunks, raw.headers.get("x-llmfleet-cache", "")


def shape(chunks: list[Any]) -> list[tuple[str | None, str | None, str | None]]:
    """(role, content, finish_reason) of each chunk with a choice: the SSE shape a client sees."""
    return [
        (c.choices[0].delta.role, c.choices[0].delta.content, c.choices[0].finish_reason)
        for c in chunks
        if c.choices
    ]


async def test_a_repeated_question_answers_from_the_cache_and_no_engine_runs(
    vector_db_url: str, redis_url: str
) -> None:
    async with gateway_env(vector_db_url, redis_url, serve=True) as env:
        team, key = await env.team_with_key("cached", rpm=100)
        other, other_key = await env.team_with_key("other", rpm=100)
        assert (await enable(env, team, {"models": {MODEL: {}}})).status_code == 200
        assert (await enable(env, other, {"models": {MODEL: {}}})).status_code == 200
        async with sdk(env, key) as client, sdk(env, other_key) as other_client:
            first, first_header = await streamed(client, ask(QUESTION))
            assert first_header == "miss"
            await entries(env, team, 1)
            ran = await engine_requests(env)
            again, header = await streamed(client, ask(QUESTION))
            assert header == "hit"
            assert shape(again) == shape(first)  # the same chunks: role, each token, the finish
            assert again[-1].choices == []
            assert again[-1].usage is not None
            assert first[-1].usage is not None
            counts = ("prompt_tokens", "completion_tokens", "total_tokens")
            assert [getattr(again[-1].usage, n) for n in counts] == [
                getattr(first[-1].usage, n) for n in counts
            ]
            assert len({c.id for c in again}) == 1
            assert again[0].id != first[0].id
            whole = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=ask(QUESTION), **GREEDY
            )
            assert whole.headers["x-llmfleet-cache"] == "hit"
            body = whole.parse()
            assert body.choices[0].message.content == "".join(c or "" for _, c, _ in shape(first))
            assert body.usage is not None
            assert body.usage.completion_tokens == first[-1].usage.completion_tokens
            assert await engine_requests(env) == ran  # the engine's own counter: nothing ran for the hits

            # Team B, the identical request: never team A's entry.
            theirs, their_header = await streamed(other_client, ask(QUESTION))
            assert their_header == "miss"
            assert await engine_requests(env) == ran + 1
            assert shape(theirs) == shape(first)  # the same greedy answer, from the engine

            # Not cacheable: sampled above the policy's max_temperature (0 by default).
            sampled = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=ask(QUESTION), max_tokens=6, temperature=0.7
            )
            assert sampled.headers["x-llmfleet-cache"] == "bypass"

        rows = await ledger(env, team)
        assert [r[1] for r in rows] == ["miss", "hit", "hit", None]
        prices = load_spec("dev").models[MODEL].prices
        for _, _, prompt, completion, cost in rows[1:3]:
            assert cost == cost_microcredits(prompt, completion, prices.cache_hit, prices.cache_hit)
            assert (prompt, completion) == (rows[0][2], rows[0][3])
        assert rows[1][4] < rows[0][4]  # a hit costs less than the answer that filled it

        # At rest: sealed with the team's key, no answer text in the row.
        async with env.pool.connection() as conn:
            cur = await conn.execute("SELECT sealed FROM response_cache WHERE team_id = %s", (team,))
            (sealed,) = await cur.fetchone()  # type: ignore[misc]
        answer = "".join(c or "" for _, c, _ in shape(first)).encode()
        assert answer
        assert answer not in bytes(sealed)


async def test_a_close_question_hits_above_the_threshold_and_misses_below(
    vector_db_url: str, redis_url: str
) -> None:
    assert cosine(embed(QUESTION, EMBED_DIMS), embed(CLOSE, EMBED_DIMS)) >= THRESHOLD
    assert cosine(embed(QUESTION, EMBED_DIMS), embed(FAR, EMBED_DIMS)) < THRESHOLD
    async with gateway_env(vector_db_url, redis_url, serve=True, fleet=FleetSetup(embed=True)) as env:
        team, key = await env.team_with_key("semantic", rpm=100)
        policy = {"models": {MODEL: {"semantic_threshold": THRESHOLD}}, "embedding_model": EMBED_MODEL}
        saved = await enable(env, team, policy)
        assert saved.status_code == 200, saved.text
        async with sdk(env, key) as client:
            first, header = await streamed(client, ask(QUESTION))
            assert header == "miss"
            await entries(env, team, 1)
            ran = await engine_requests(env)
            close, header = await streamed(client, ask(CLOSE))
            assert header == "hit"
            assert shape(close) == shape(first)
            assert await engine_requests(env) == ran
            _, header = await streamed(client, ask(FAR))
            assert header == "miss"
            assert await engine_requests(env) == ran + 1
            # Another system prompt is another context: never a semantic match across it.
            other_context = [
                {"role": "system", "content": "Answer in French."},
                {"role": "user", "content": CLOSE},
            ]
            _, header = await streamed(client, other_context)
            assert header == "miss"
        async with env.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM usage_ledger WHERE team_id = %s AND request_id LIKE %s AND status = 'settled'",
                (team, "%:cache-embed"),
            )
            embeds = await cur.fetchone()
        assert embeds is not None
        assert embeds[0] == 4


async def test_a_new_model_revision_misses_and_a_purge_forgets(vector_db_url: str, redis_url: str) -> None:
    async with gateway_env(vector_db_url, redis_url, serve=True) as env:
        team, key = await env.team_with_key("revisions", rpm=100)
        assert (await enable(env, team, {"models": {MODEL: {}}, "ttl_s": 600})).status_code == 200
        async with sdk(env, key) as client:
            _, header = await streamed(client, ask(QUESTION))
            assert header == "miss"
            await entries(env, team, 1)
            _, header = await streamed(client, ask(QUESTION))
            assert header == "hit"
            async with env.pool.connection() as conn:  # the model's stable revision is now another
                await conn.execute(
                    "INSERT INTO model_rollouts (model, stable_revision) VALUES (%s, 'next-revision')",
                    (MODEL,),
                )
            ran = await engine_requests(env)
            _, header = await streamed(client, ask(QUESTION))
            assert header == "miss"
            assert await engine_requests(env) == ran + 1
            async with env.pool.connection() as conn:
                await conn.execute("DELETE FROM model_rollouts WHERE model = %s", (MODEL,))
            _, header = await streamed(client, ask(QUESTION))
            assert header == "hit"  # back on the revision the entry was made by
            async with httpx.AsyncClient(base_url=env.base_url, headers=env.admin_headers()) as admin:
                stats = (await admin.get(f"/admin/teams/{team}/cache/stats")).json()
                assert stats["entries"] == 1
                assert stats["hits"] == 2
                purged = await admin.delete(f"/admin/teams/{team}/cache/entries")
                assert purged.json() == {"team_id": team, "deleted": 1}
            _, header = await streamed(client, ask(QUESTION))
            assert header == "miss"


async def test_a_completion_is_cached_too_and_a_new_guardrail_policy_misses(
    migrated_db_url: str, redis_url: str
) -> None:
    """On the test server as it is (Debian's PostgreSQL has no pgvector): exact matches need none."""
    async with gateway_env(migrated_db_url, redis_url, serve=True) as env:
        team, key = await env.team_with_key("completions", rpm=100)
        assert (await enable(env, team, {"models": {MODEL: {}}})).status_code == 200
        async with sdk(env, key) as client:
            first = await client.completions.with_raw_response.create(
                model=MODEL, prompt="Once upon a time", **GREEDY
            )
            assert first.headers["x-llmfleet-cache"] == "miss"
            await entries(env, team, 1)
            again = await client.completions.with_raw_response.create(
                model=MODEL, prompt="Once upon a time", stream=True, **GREEDY
            )
            # Stored from a whole answer, replayed as a stream.
            assert again.headers["x-llmfleet-cache"] == "hit"
            texts = [c.choices[0].text async for c in again.parse() if c.choices]
            assert "".join(texts) == first.parse().choices[0].text
            # The team's output checks change: an answer stored under the old ones is never replayed.
            async with httpx.AsyncClient(base_url=env.base_url, headers=env.admin_headers()) as admin:
                policy = {"output": [{"detector": "email", "action": "redact"}]}
                assert (await admin.put(f"/admin/teams/{team}/guardrails", json=policy)).status_code == 200
            ran = await engine_requests(env)
            after = await client.completions.with_raw_response.create(
                model=MODEL, prompt="Once upon a time", **GREEDY
            )
            assert after.headers["x-llmfleet-cache"] == "miss"
            assert await engine_requests(env) == ran + 1
