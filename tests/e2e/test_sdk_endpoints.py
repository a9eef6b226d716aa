"""`/v1/completions` and `/v1/embeddings` with the official `openai` SDK (issue 31): the gateway on
loopback in front of the real platform in-process (`tests/fleet.py`: orchestrator, agents, enginesim
serving the 8B chat model and the dev stack's embedding model), real PostgreSQL and Redis. Each call
is billed in the ledger at the engine's own counts, through the same quotas as chat."""

from __future__ import annotations

import base64
import struct

import openai
import pytest

from tests.fleet import EMBED_DIMS, EMBED_MODEL, FleetSetup
from tests.gateway_env import GatewayEnv, gateway_env

pytestmark = pytest.mark.timeout(120)

MODEL = "llama-3.1-8b-instruct"
WHOLE = {"ignore_eos": True}  # vLLM's extra: the answer is exactly `max_tokens` long


def sdk(env: GatewayEnv, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=env.base_url + "/v1", api_key=key, max_retries=0, timeout=30)


async def _rows(env: GatewayEnv, team_id: int) -> list[tuple[str, str, int, int, int]]:
    """(model, status, prompt tokens, completion tokens, cost) of each of the team's ledger rows."""
    await env.settled()
    async with env.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT model, status::text, prompt_tokens, completion_tokens, cost_microcredits "
            "FROM usage_ledger WHERE team_id = %s ORDER BY id",
            (team_id,),
        )
        return [tuple(row) for row in await cur.fetchall()]  # type: ignore[misc]


async def test_completions_stream_and_not_and_are_billed_like_chat(
    migrated_db_url: str, redis_url: str
) -> None:
    async with gateway_env(migrated_db_url, redis_url, serve=True, fleet=FleetSetup(embed=True)) as env:
        team, key = await env.team_with_key("c", rpm=50, tokens_per_day=100_000)
        before = await env.balance(team)
        async with sdk(env, key) as client:
            done = await client.completions.create(
                model=MODEL, prompt="Once upon a time", max_tokens=4, extra_body=WHOLE
            )
            assert done.object == "text_completion"
            assert done.choices[0].text
            assert done.choices[0].finish_reason == "length"
            assert done.usage is not None
            assert done.usage.completion_tokens == 4
            stream = await client.completions.create(
                model=MODEL,
                prompt="Once upon a time",
                max_tokens=3,
                stream=True,
                stream_options={"include_usage": True},
                extra_body=WHOLE,
            )
            chunks = [c async for c in stream]
            texts = [c.choices[0].text for c in chunks if c.choices]
            assert len(texts) == 3  # one chunk per token, no role chunk
            assert chunks[-1].choices == []
            assert chunks[-1].usage is not None
            assert chunks[-1].usage.completion_tokens == 3
            raw = await client.completions.with_raw_response.create(
                model=MODEL, prompt="hi", extra_body=WHOLE
            )
            assert raw.headers["x-ratelimit-limit-requests"] == "50"
            assert raw.parse().usage.completion_tokens == 16  # type: ignore[union-attr]  # OpenAI's default
            with pytest.raises(openai.BadRequestError) as several:
                await client.completions.create(model=MODEL, prompt=["a", "b"], max_tokens=2)
            assert several.value.param == "prompt"
        rows = await _rows(env, team)
        assert [(m, s, c) for m, s, _, c, _ in rows] == [
            (MODEL, "settled", 4),
            (MODEL, "settled", 3),
            (MODEL, "settled", 16),
        ]
        assert rows[0][2] == done.usage.prompt_tokens
        assert before - await env.balance(team) == sum(cost for *_, cost in rows) > 0


async def test_embeddings_float_and_base64_billed_at_the_prompt_price(
    migrated_db_url: str, redis_url: str
) -> None:
    async with gateway_env(migrated_db_url, redis_url, serve=True, fleet=FleetSetup(embed=True)) as env:
        team, key = await env.team_with_key("e", rpm=50)
        before = await env.balance(team)
        async with sdk(env, key) as client:
            floats = await client.embeddings.create(model=EMBED_MODEL, input=["the cat sat", "a dog ran"])
            assert [d.index for d in floats.data] == [0, 1]
            assert all(len(d.embedding) == EMBED_DIMS for d in floats.data)
            assert floats.data[0].embedding != floats.data[1].embedding
            again = await client.embeddings.create(model=EMBED_MODEL, input="the cat sat")
            assert again.data[0].embedding == floats.data[0].embedding  # the same text, the same vector
            packed = await client.embeddings.with_raw_response.create(
                model=EMBED_MODEL, input="the cat sat", encoding_format="base64"
            )
            blob = packed.http_response.json()["data"][0]["embedding"]
            numbers = struct.unpack(f"<{EMBED_DIMS}f", base64.b64decode(blob))
            assert numbers == pytest.approx(floats.data[0].embedding, rel=1e-6)
            assert floats.usage.prompt_tokens > 0
            with pytest.raises(openai.BadRequestError) as wrong:
                await client.chat.completions.create(
                    model=EMBED_MODEL, messages=[{"role": "user", "content": "x"}]
                )
            assert (wrong.value.code, wrong.value.param) == ("unsupported_model", "model")
            with pytest.raises(openai.BadRequestError) as empty:
                await client.embeddings.create(model=EMBED_MODEL, input=["ok", ""])
            assert empty.value.param == "input.1"
        rows = await _rows(env, team)
        assert [(m, s, c) for m, s, _, c, _ in rows] == [(EMBED_MODEL, "settled", 0)] * 3
        assert rows[0][2] == floats.usage.prompt_tokens
        assert before - await env.balance(team) == sum(cost for *_, cost in rows) > 0


async def test_embeddings_count_against_the_keys_quotas(migrated_db_url: str, redis_url: str) -> None:
    async with gateway_env(migrated_db_url, redis_url, serve=True, fleet=FleetSetup(embed=True)) as env:
        _, key = await env.team_with_key("q", rpm=2, model_allowlist=[EMBED_MODEL])
        async with sdk(env, key) as client:
            await client.embeddings.create(model=EMBED_MODEL, input="one")
            await client.embeddings.create(model=EMBED_MODEL, input="two")
            with pytest.raises(openai.RateLimitError) as limited:
                await client.embeddings.create(model=EMBED_MODEL, input="three")
            assert limited.value.code == "rpm"
            with pytest.raises(openai.PermissionDeniedError) as denied:
                await client.completions.create(model=MODEL, prompt="x")
            assert denied.value.code == "model_not_allowed"
