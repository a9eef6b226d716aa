"""The gateway served by uvicorn on loopback, driven by the official `openai` SDK, in front of the
real platform in-process (`tests/fleet.py`: orchestrator, node agent, enginesim; real PostgreSQL and
Redis)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.fleet import FleetSetup
from tests.gateway_env import GatewayEnv, gateway_env

MODEL = "llama-3.1-8b-instruct"
MSG: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]
WHOLE = {"ignore_eos": True}  # vLLM's extra: the answer is exactly `max_tokens` long


def sdk(env: GatewayEnv, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=env.base_url + "/v1", api_key=key, max_retries=0, timeout=30)


async def poll(predicate: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await predicate()
        if value:
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_streaming_with_and_without_usage_and_raw_headers(migrated_db_url: str, redis_url: str) -> None:
    async with gateway_env(migrated_db_url, redis_url, serve=True) as env:
        _, key = await env.team_with_key("a", rpm=50, tokens_per_day=100_000)
        async with sdk(env, key) as client:
            stream = await client.chat.completions.create(
                model=MODEL, messages=MSG, max_tokens=5, stream=True, extra_body=WHOLE
            )
            chunks = [c async for c in stream]
            pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
            assert len(pieces) == 5  # one chunk per token
            assert chunks[-1].choices[0].finish_reason == "length"
            assert all(c.usage is None for c in chunks)

            stream = await client.chat.completions.create(
                model=MODEL,
                messages=MSG,
                max_tokens=3,
                stream=True,
                stream_options={"include_usage": True},
                extra_body=WHOLE,
            )
            chunks = [c async for c in stream]
            assert chunks[-1].choices == []
            assert chunks[-1].usage is not None
            assert chunks[-1].usage.completion_tokens == 3

            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=MSG, max_tokens=2, extra_body=WHOLE
            )
            assert raw.headers["x-ratelimit-limit-requests"] == "50"
            assert int(raw.headers["x-ratelimit-remaining-requests"]) == 47
            assert raw.headers["x-ratelimit-limit-tokens"] == "100000"
            assert raw.headers["x-request-id"]
            done = raw.parse()
            assert done.usage is not None
            assert done.usage.completion_tokens == 2
            models = await client.models.list()
            assert {m.id for m in models.data} >= {MODEL}


async def test_sdk_exception_classes(migrated_db_url: str, redis_url: str) -> None:
    async with gateway_env(migrated_db_url, redis_url, serve=True) as env:
        _, key = await env.team_with_key("a", model_allowlist=[MODEL], rpm=1)
        _, broke = await env.team_with_key("b", credits=0)
        async with sdk(env, "sk-lf-invalid") as bad, sdk(env, key) as good, sdk(env, broke) as poor:
            with pytest.raises(openai.AuthenticationError):
                await bad.chat.completions.create(model=MODEL, messages=MSG)
            with pytest.raises(openai.PermissionDeniedError):
                await good.chat.completions.create(model="llama-3.3-70b-instruct-fp8", messages=MSG)
            with pytest.raises(openai.NotFoundError):
                await good.chat.completions.create(model="gpt-17", messages=MSG)
            with pytest.raises(openai.BadRequestError) as bad_req:
                await good.chat.completions.create(model=MODEL, messages=MSG, max_tokens=10**6)
            assert bad_req.value.body["param"] == "max_tokens"  # type: ignore[index]
            with pytest.raises(openai.APIStatusError) as no_money:
                await poor.chat.completions.create(model=MODEL, messages=MSG)
            assert no_money.value.status_code == 402
            await good.chat.completions.create(model=MODEL, messages=MSG, max_tokens=1)
            with pytest.raises(openai.RateLimitError) as limited:
                await good.chat.completions.create(model=MODEL, messages=MSG)
            assert int(limited.value.response.headers["retry-after"]) >= 1
    # No node serves the model: the orchestrator's 503 reaches the SDK as its own class and code.
    async with gateway_env(migrated_db_url, redis_url, serve=True, fleet=FleetSetup(nodes=0)) as env:
        _, key = await env.team_with_key("c")
        async with sdk(env, key) as client:
            with pytest.raises(openai.InternalServerError) as unavailable:
                await client.chat.completions.create(model=MODEL, messages=MSG)
            assert unavailable.value.status_code == 503
            assert unavailable.value.code == "model_unavailable"


async def test_500_concurrent_streams_one_key_max_streams_5(migrated_db_url: str, redis_url: str) -> None:
    async with gateway_env(migrated_db_url, redis_url, serve=True) as env:
        _, key = await env.team_with_key("a", max_streams=5)
        assert env.fleet.engine is not None
        await env.fleet.pause()  # the admitted streams wait at the engine, holding their slots
        async with sdk(env, key) as client:

            async def one() -> object:
                try:
                    return await client.chat.completions.create(
                        model=MODEL, messages=MSG, max_tokens=3, stream=True
                    )
                except openai.RateLimitError as exc:
                    return exc

            calls = [asyncio.ensure_future(one()) for _ in range(500)]
            while sum(c.done() for c in calls) < 495:  # the refused ones answer while the engine is paused
                await asyncio.wait([c for c in calls if not c.done()], return_when=asyncio.FIRST_COMPLETED)
            refused = [c.result() for c in calls if c.done()]
            assert all(isinstance(r, openai.RateLimitError) for r in refused)
            assert all(r.body["code"] == "max_streams" for r in refused)  # type: ignore[attr-defined]
            deadline = time.monotonic() + 20
            while env.fleet.engine.busy() < 5:  # the five admitted reach the engine
                assert time.monotonic() < deadline, f"{env.fleet.engine.busy()} of 5 at the engine"
                await asyncio.sleep(0.01)
            await env.fleet.resume()
            streams = await asyncio.gather(*(c for c in calls if not c.done()))
            assert len(streams) == 5
            assert not any(isinstance(s, openai.RateLimitError) for s in streams)
            assert env.dispatcher.max_open <= 5
            for s in streams:
                assert [c async for c in s][-1].choices[0].finish_reason is not None  # type: ignore[attr-defined]
        await poll(lambda: _scard_zero(env, "1"), "stream slots released")


async def _scard_zero(env: GatewayEnv, subject: str) -> bool:
    return bool(await env.redis.scard(f"streams:{subject}") == 0)


@pytest.mark.timeout(300)
async def test_500_abandoned_streams_leave_nothing_behind(migrated_db_url: str, redis_url: str) -> None:
    # The engine at the tiny profile's own pace: 500 streams of 5,000 tokens run for minutes. Every one
    # of them must be admitted however slow the machine: its KV cache fills until the aborts land, and
    # the queue that forms meanwhile predicts its wait from how fast aborts free it (under four CPU
    # burners: over 30 s, so the default deadlines answered 429 team_queue_full). Deadlines past the
    # test's own timeout make the queue wait instead of refusing.
    deadlines = {"queue_limit_s": 600.0}
    fleet = FleetSetup(speed=1.0, orchestrator=deadlines)
    async with gateway_env(migrated_db_url, redis_url, serve=True, fleet=fleet, queue_wait_s=600.0) as env:
        _, key = await env.team_with_key("a", max_streams=1000)
        baseline = len(asyncio.all_tasks())
        headers = {"Authorization": f"Bearer {key}"}
        body = {"model": MODEL, "messages": MSG, "max_tokens": 5000, "stream": True, **WHOLE}
        connector = aiohttp.TCPConnector(limit=600)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def abandon(i: int) -> None:
                resp = await session.post(env.base_url + "/v1/chat/completions", json=body, headers=headers)
                assert resp.status == 200, await resp.text()
                if i % 2:
                    await resp.content.readany()  # mid-stream for half, before any token for the other half
                resp.close()  # drop the connection without reading the rest

            await asyncio.gather(*(abandon(i) for i in range(500)))

        async def settled() -> bool:
            async with env.pool.connection() as conn:
                row = await (
                    await conn.execute("SELECT count(*) FROM usage_ledger WHERE status = 'reserved'")
                ).fetchone()
            return row is not None and row[0] == 0

        await poll(lambda: _scard_zero(env, "1"), "stream set back to empty")
        await poll(settled, "no reserved ledger rows")

        async def tasks_back() -> bool:
            return len(asyncio.all_tasks()) <= baseline

        await poll(tasks_back, "asyncio tasks back to baseline")
        async with env.pool.connection() as conn:
            rows = await (
                await conn.execute("SELECT status::text, count(*) FROM usage_ledger GROUP BY 1")
            ).fetchall()
        assert rows == [("settled", 500)]
        assert env.dispatcher.closed == 500
        assert env.dispatcher.open_now == 0


async def test_non_streaming_client_that_leaves_stops_the_request_and_settles_what_ran(
    migrated_db_url: str, redis_url: str
) -> None:
    # A slow engine (about 30 tokens/s a stream): 5,000 tokens would take minutes.
    async with gateway_env(migrated_db_url, redis_url, serve=True, fleet=FleetSetup(speed=0.05)) as env:
        _, key = await env.team_with_key("a", max_streams=10)
        headers = {"Authorization": f"Bearer {key}"}
        body = {"model": MODEL, "messages": MSG, "max_tokens": 5000, **WHOLE}  # not streaming
        async with aiohttp.ClientSession() as session:

            async def ask() -> None:
                async with session.post(
                    env.base_url + "/v1/chat/completions", json=body, headers=headers
                ) as r:
                    await r.read()

            callers = [asyncio.create_task(ask()) for _ in range(5)]

            async def all_running() -> bool:
                return env.dispatcher.open_now == 5  # each answered by the orchestrator (a first token)

            await poll(all_running, "five requests running upstream")
            for c in callers:
                c.cancel()  # the client gives up: aiohttp drops the connection
            await asyncio.gather(*callers, return_exceptions=True)

        async def stopped() -> bool:
            return env.dispatcher.closed == 5 and env.dispatcher.open_now == 0

        await poll(stopped, "the upstream requests closed")
        await poll(lambda: _scard_zero(env, "1"), "stream slots released")

        rows: list[tuple[str, int]] = []

        async def settled() -> bool:
            async with env.pool.connection() as conn:
                cur = await conn.execute("SELECT status::text, completion_tokens FROM usage_ledger")
                rows[:] = await cur.fetchall()
            return [s for s, _ in rows] == ["settled"] * 5 and 0 < max(t for _, t in rows) < 5000

        try:
            await poll(settled, "five rows settled with the tokens produced before the client left")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; rows: {rows}") from None
