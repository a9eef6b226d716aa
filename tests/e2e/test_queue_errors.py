"""The orchestrator's queue refusals reach the official `openai` SDK with their own codes: a real
orchestrator (in-process, real Redis) with one scripted node of one slot, the real gateway served
by uvicorn dispatching to it over HTTP (`HttpDispatcher`), real PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from apps.core.protocol import node as proto
from apps.gateway.dispatcher import HttpDispatcher
from apps.orchestrator.app import PLANE
from tests.fakes.fake_gateway import gateway_env
from tests.fakes.fake_node import Auto, FakeNode
from tests.integration.orchestrator_env import TOKEN, Env, env, eventually, poll

__all__ = ["env"]  # the fixture, imported for pytest

MODEL = "llama-3.1-8b-instruct"
MSG: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]


async def test_queue_full_and_queue_timeout_keep_their_codes(
    env: Env, migrated_db_url: str, redis_url: str
) -> None:
    orch = await env.orchestrator(
        models=frozenset({MODEL}), orchestrator_id="orch-queue", queue_max_per_model=1
    )
    gate = asyncio.Event()
    node = FakeNode(
        orch.ws_url,
        "gpu-1",
        await env.store.issue_token("gpu-1", "onprem"),
        models=[proto.ModelInfo(name=MODEL, max_num_seqs=1, max_model_len=4096)],
        auto=Auto(tokens=2, gate=gate),
        heartbeat_every_s=0.2,
    )
    env.nodes.append(node)
    assert isinstance(await node.connect(), proto.RegisterAck)

    def dispatcher(_ledger: Any, _redis: Any) -> Any:
        return HttpDispatcher([orch.url], TOKEN)

    async with gateway_env(
        # 5 s in the queue: the third request must reach it (SDK, gateway, reservation, dispatch on
        # one loaded event loop) while the second still waits there.
        migrated_db_url,
        redis_url,
        serve=True,
        dispatcher_factory=dispatcher,
        queue_wait_s=5.0,
    ) as gw:
        _, key = await gw.team_with_key("a")
        async with openai.AsyncOpenAI(base_url=gw.base_url + "/v1", api_key=key, max_retries=0) as client:
            holder = await client.chat.completions.create(model=MODEL, messages=MSG, stream=True)
            first = await anext(aiter(holder))  # the node's only slot is taken (the gate holds it)
            assert first.choices
            waiting = asyncio.ensure_future(client.chat.completions.create(model=MODEL, messages=MSG))
            plane = orch.app[PLANE]
            await eventually(lambda: _true(plane.queues.depth(MODEL) == 1))
            with pytest.raises(openai.RateLimitError) as full:
                await client.chat.completions.create(model=MODEL, messages=MSG)
            assert full.value.code == "queue_full"
            assert full.value.status_code == 429
            assert int(full.value.response.headers["retry-after"]) >= 1
            with pytest.raises(openai.InternalServerError) as timed_out:
                await waiting
            assert timed_out.value.code == "queue_timeout"
            assert timed_out.value.status_code == 503
            assert int(timed_out.value.response.headers["retry-after"]) >= 1
            gate.set()
            rest = [c async for c in holder]
            assert rest

        async def statuses() -> dict[str, int]:
            async with gw.pool.connection() as conn:
                cur = await conn.execute("SELECT status::text, count(*) FROM usage_ledger GROUP BY 1")
                return {str(status): int(n) for status, n in await cur.fetchall()}

        # The two refused requests reserved nothing in the end; the holder is settled by the
        # orchestrator on the same ledger (its settle runs after the stream's end).
        assert await poll(statuses, lambda seen: seen == {"cancelled": 2, "settled": 1})


async def _true(value: bool) -> bool:
    return value
