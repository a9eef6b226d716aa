"""The orchestrator's queue refusals reach the official `openai` SDK with their own codes: the real
gateway served by uvicorn in front of the real platform in-process (`tests/fleet.py`: an orchestrator
whose queue holds one waiter, a node of one slot), real PostgreSQL and Redis."""

from __future__ import annotations

import asyncio

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from apps.enginesim.faults import Faults
from apps.orchestrator.app import PLANE
from tests.fleet import FleetSetup
from tests.gateway_env import gateway_env
from tests.integration.orchestrator_env import eventually, poll

MODEL = "llama-3.1-8b-instruct"
MSG: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]

# The first request stalls after its first token for longer than the test runs (enginesim's
# `stall_s`, one request only): it holds the node's only slot until its client leaves.
ONE_SLOT = FleetSetup(
    slots=1,
    faults=Faults(stall_s=300.0, stall_after_tokens=1, times=1),
    orchestrator={"queue_max_per_model": 1},
)


async def test_queue_full_and_queue_timeout_keep_their_codes(migrated_db_url: str, redis_url: str) -> None:
    async with gateway_env(
        # 5 s in the queue: the third request must reach it (SDK, gateway, reservation, dispatch on
        # one loaded event loop) while the second still waits there.
        migrated_db_url,
        redis_url,
        serve=True,
        fleet=ONE_SLOT,
        queue_wait_s=5.0,
    ) as gw:
        _, key = await gw.team_with_key("a")
        async with openai.AsyncOpenAI(base_url=gw.base_url + "/v1", api_key=key, max_retries=0) as client:
            holder = await client.chat.completions.create(
                model=MODEL, messages=MSG, stream=True, max_tokens=50, extra_body={"ignore_eos": True}
            )
            first = await anext(aiter(holder))  # the node's only slot is taken (the stall holds it)
            assert first.choices
            waiting = asyncio.ensure_future(client.chat.completions.create(model=MODEL, messages=MSG))
            plane = gw.fleet.orchestrator.app[PLANE]
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
            await holder.close()  # the holder's client leaves: the engine stops it, what ran is billed

        async def statuses() -> dict[str, int]:
            async with gw.pool.connection() as conn:
                cur = await conn.execute("SELECT status::text, count(*) FROM usage_ledger GROUP BY 1")
                return {str(status): int(n) for status, n in await cur.fetchall()}

        # The two refused requests reserved nothing in the end; the holder is settled by the
        # orchestrator on the same ledger (its settle runs after the stream's end).
        assert await poll(statuses, lambda seen: seen == {"cancelled": 2, "settled": 1})


async def _true(value: bool) -> bool:
    return value
