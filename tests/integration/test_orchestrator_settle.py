"""Settlement through the orchestrator: exactly once, acknowledged after the commit, partial
usage on failures and disconnects, and the sweeper for what nobody reported."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest

from apps.core.ledger.api import ReservationStatus
from apps.core.nodes import keys
from apps.core.protocol import node as proto
from apps.core.protocol.dispatch import DISPATCH_PATH
from apps.orchestrator.app import SWEEPER
from tests.fakes.fake_node import Auto, FakeNode, vllm_chunk
from tests.integration.orchestrator_env import TOKEN, Env, eventually


async def test_engine_error_mid_stream_settles_the_tokens_produced(env: Env) -> None:
    _, node, task, _ = await env.assigned()
    await node.chunk("r1", vllm_chunk("r1", "m", "a"))
    await node.error("r1", 500, "engine died", chunks_sent=1, prompt_tokens=9, completion_tokens=1)
    status, _, body = await task
    assert status == 200
    assert b"engine died" in body
    assert body.endswith(b"data: [DONE]\n\n")
    await eventually(lambda: env.ledger.has("r1", ReservationStatus.SETTLED))
    assert env.ledger.settle_calls == [("r1", 9, 1)]


@pytest.mark.parametrize(
    "request_body",
    [
        {"messages": []},
        # A stream that could resume: its `done(abort)` comes after the relay ended (it freed its
        # route), which is not a journal replay to defer to a resume (settle.Settler._defer).
        {"messages": [{"role": "user", "content": "hi"}], "stream": True},
    ],
    ids=["plain", "resumable"],
)
async def test_gateway_disconnect_cancels_on_the_node_and_settles_what_was_produced(
    env: Env, request_body: dict[str, object]
) -> None:
    orch = await env.orchestrator()
    gate = asyncio.Event()
    node = await env.node(orch, "n1", auto=Auto(tokens=5, prompt_tokens=4, gate=gate))
    await env.ledger.add("r1")
    body = {"request_id": "r1", "team_id": 1, "model": "m", "body": request_body}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as session:
        resp = await session.post(orch.url + DISPATCH_PATH, json=body, headers=headers)
        assert resp.status == 200
        await resp.content.readuntil(b"\n\n")
        resp.close()
    await node.wait_for(lambda: "r1" in node.cancels)
    await node.wait_for(lambda: "r1" in node.acks)
    await eventually(lambda: env.ledger.has("r1", ReservationStatus.SETTLED))
    assert env.ledger.settle_calls == [("r1", 4, 1)]


async def test_replayed_done_settles_once_and_is_acked_each_time(env: Env) -> None:
    orch = await env.orchestrator()
    node = await env.node(orch, "n1")
    await env.ledger.add("r9")
    task = asyncio.create_task(env.dispatch(orch, "r9"))
    await asyncio.wait_for(node.assigns.get(), 5)  # r9 is n1's: its reports settle (issue 27 item 1)
    await node.done("r9", 3, 4, finish_reason="stop")
    await node.wait_for(lambda: node.acks.count("r9") == 1)
    assert (await task)[0] == 200
    await node.close()
    again = FakeNode(orch.ws_url, "n1", node.token, in_flight=["r9"])
    env.nodes.append(again)
    ack = await again.connect()
    assert isinstance(ack, proto.RegisterAck)
    assert ack.unknown_requests == ["r9"]
    await again.done("r9", 3, 4, finish_reason="stop")
    await again.wait_for(lambda: "r9" in again.acks)
    assert await env.ledger.status("r9") is ReservationStatus.SETTLED
    assert len(env.ledger.settle_calls) == 2  # the second is a no-op in the ledger
    assert json.loads(await env.redis.get(keys.done_key("r9")) or "null")["completion_tokens"] == 4


async def test_sweeper_settles_from_done_or_partial_records_and_cancels_the_rest(env: Env) -> None:
    orch = await env.orchestrator(max_request_s=60)
    old = datetime.now(UTC) - timedelta(hours=1)
    for rid in ("s-done", "s-partial", "s-none"):
        await env.ledger.add(rid, created_at=old)
    await env.ledger.add("s-young")
    await env.redis.set(keys.done_key("s-done"), json.dumps({"prompt_tokens": 2, "completion_tokens": 3}))
    await env.redis.set(
        keys.partial_key("s-partial"), json.dumps({"prompt_tokens": 0, "completion_tokens": 4})
    )
    counts = await orch.app[SWEEPER].sweep_once()
    assert counts == {"settled": 1, "settled_partial": 1, "cancelled": 1}
    assert await env.ledger.completion_tokens("s-done") == 3
    assert await env.ledger.completion_tokens("s-partial") == 4
    assert await env.ledger.status("s-none") is ReservationStatus.CANCELLED
    assert await env.ledger.status("s-young") is ReservationStatus.RESERVED
