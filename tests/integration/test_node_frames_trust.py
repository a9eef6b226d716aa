"""Issue 27 items 1-2, node trust (second pass): a scripted WebSocket node with a real node token
against a real orchestrator (in-process), real PostgreSQL (ledger, node tokens) and Redis.

1. A node's `done`/`error` settles only a request assigned to that node (on this socket, or on an
   earlier socket of the same node: the agent's journal replay). On main, a `done` naming a request
   still waiting in the queue settled it at its full reservation.
2. A node's completion count must agree with the content events it relayed (within the tolerance
   of `apps/orchestrator/tolerance.py`): beyond it the relayed count is settled, the node is
   quarantined and counted. On main, 5 events and a report of 200 settled 200.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from apps.core.nodes import keys
from apps.core.protocol import node as proto
from tests.fakes.fake_node import FakeNode, vllm_chunk
from tests.integration.orchestrator_env import LedgerRow, poll
from tests.integration.test_node_trust import CREDITS, MODEL, Trust, metric, orch_metrics, trust_env


@contextlib.asynccontextmanager
async def trust_nodes(db_url: str, redis_url: str, work: Path, **overrides: Any) -> AsyncIterator[Trust]:
    """`trust_env`, closing the scripted nodes (`Trust.scripted`) first."""
    async with trust_env(db_url, redis_url, work, **overrides) as env:
        try:
            yield env
        finally:
            for node in SCRIPTED.pop(id(env), []):
                await node.close()


SCRIPTED: dict[int, list[FakeNode]] = {}


async def scripted_node(env: Trust, node_id: str, seqs: int = 1, **kw: Any) -> FakeNode:
    """A node registered with a real token for `MODEL` (`seqs` slots), driven by the test."""
    token = await env.store.issue_token(node_id, "onprem", models=[MODEL])
    node = FakeNode(
        env.orch.ws_url,
        node_id,
        token,
        models=[proto.ModelInfo(name=MODEL, max_num_seqs=seqs, max_model_len=1024)],
        heartbeat_every_s=0.2,
        **kw,
    )
    SCRIPTED.setdefault(id(env), []).append(node)
    ack = await node.connect()
    assert isinstance(ack, proto.RegisterAck), ack
    await env.ready(node_id)
    return node


async def balance(env: Trust) -> int:
    async with env.pool.connection() as conn:
        cur = await conn.execute("SELECT balance_microcredits FROM teams WHERE id = %s", (env.team_id,))
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def queued(env: Trust, depth: int) -> None:
    await poll(
        lambda: orch_metrics(env),
        lambda t: metric(t, "llmfleet_orchestrator_queue_depth", model=MODEL) == depth,
    )


@pytest.mark.parametrize("kind", ["done", "error"])
async def test_a_node_cannot_settle_a_queued_request_it_was_never_assigned(
    migrated_db_url: str, redis_url: str, tmp_path: Path, kind: str
) -> None:
    async with trust_nodes(migrated_db_url, redis_url, tmp_path, queue_limit_s=30.0) as env:
        node = await scripted_node(env, f"fake-{uuid.uuid4().hex[:6]}")
        own = await env.reserve(64, 16)
        own_task = asyncio.create_task(env.dispatch(own, 64, 16))
        assert (await asyncio.wait_for(node.assigns.get(), 10)).request_id == own
        victim = await env.reserve(64, 16)
        victim_task = asyncio.create_task(env.dispatch(victim, 64, 16))
        await queued(env, 1)  # the node's one slot is taken: the victim waits in the queue
        before, funds = await env.row(victim), await balance(env)
        assert before is not None
        assert before.status == "reserved"

        if kind == "done":
            await node.done(victim, 1_000_000, 1_000_000, finish_reason="stop")
            # Acknowledged (an agent replaying an old report forgets it), not settled.
            await node.wait_for(lambda: victim in node.acks)
        else:
            await node.error(victim, chunks_sent=5, prompt_tokens=1_000_000, completion_tokens=1_000_000)
        handled = ("settled", "not_assigned")  # main settled it; now it is refused
        text = await poll(
            lambda: orch_metrics(env),
            lambda t: sum(metric(t, "llmfleet_orchestrator_settles_total", outcome=o) for o in handled) == 1,
        )
        assert await env.row(victim) == before  # on main: ("settled", 64, 16, 96)
        assert await balance(env) == funds
        assert await env.redis.get(keys.done_key(victim)) is None  # nothing for the sweeper either
        assert metric(text, "llmfleet_orchestrator_settles_total", outcome="not_assigned") == 1
        assert victim_task.done() is False

        # The real answer settles: the node finishes its own request, gets the victim, answers it.
        await node.chunk(own, vllm_chunk(own, MODEL, "a"))
        await node.done(own, 7, 1, finish_reason="stop")
        assert (await asyncio.wait_for(node.assigns.get(), 10)).request_id == victim
        await node.chunk(victim, vllm_chunk(victim, MODEL, "b"))
        await node.chunk(victim, vllm_chunk(victim, MODEL, "c", finish="stop"))
        await node.done(victim, 9, 2, finish_reason="stop")
        assert await own_task == 200
        assert await victim_task == 200
        row = await poll(lambda: env.row(victim), lambda r: r is not None and r.status != "reserved")
        assert row == LedgerRow("settled", 9, 2, 13)
        # The two settles run on different settle workers: wait for the node's own one too before
        # reading the team's balance (a CI run read it between the two).
        mine = await poll(lambda: env.row(own), lambda r: r is not None and r.status != "reserved")
        assert mine == LedgerRow("settled", 7, 1, 9)
        assert await balance(env) == CREDITS - 13 - (7 + 2)


async def test_a_replayed_done_of_the_nodes_own_earlier_assignment_still_settles(
    migrated_db_url: str, redis_url: str, tmp_path: Path
) -> None:
    """The agent's journal replays an unacknowledged `done` on its next socket: the assignment
    recorded in Redis names this node, so it settles; the events the old socket relayed count."""
    async with trust_nodes(migrated_db_url, redis_url, tmp_path) as env:
        node = await scripted_node(env, f"replay-{uuid.uuid4().hex[:6]}", seqs=2)
        mine = await env.reserve(64, 16)
        task = asyncio.create_task(env.dispatch(mine, 64, 16))
        assert (await asyncio.wait_for(node.assigns.get(), 10)).request_id == mine
        for word in ("a", "b", "c"):
            await node.chunk(mine, vllm_chunk(mine, MODEL, word))
        await node.abort()  # the link drops before the node's report
        await task
        again = FakeNode(env.orch.ws_url, node.node_id, node.token, models=node.models, in_flight=[mine])
        SCRIPTED[id(env)].append(again)
        assert isinstance(await again.connect(), proto.RegisterAck)
        await again.done(mine, 5, 3, finish_reason="abort")
        await again.wait_for(lambda: mine in again.acks)
        row = await poll(lambda: env.row(mine), lambda r: r is not None and r.status == "settled")
        assert row == LedgerRow("settled", 5, 3, 11)
        assert not await env.redis.sismember(keys.NODES_QUARANTINED, node.node_id)


async def test_a_replayed_report_beyond_what_the_lost_socket_relayed_does_not_quarantine_the_node(
    migrated_db_url: str, redis_url: str, tmp_path: Path
) -> None:
    """The loaded CI run of 2026-12-07: a node's socket is lost mid-stream; the agent aborts the
    request and replays the engine's count on its next socket. The engine made more tokens than
    reached the relay (what went into the dying socket, and what it made until the abort), so the
    report exceeds the old socket's count. The relayed count is billed, and the node is not
    quarantined: on the old code it was, and the requests queued behind it got 503."""
    async with trust_nodes(migrated_db_url, redis_url, tmp_path) as env:
        node = await scripted_node(env, f"lost-{uuid.uuid4().hex[:6]}", seqs=2)
        mine = await env.reserve(64, 200)
        task = asyncio.create_task(env.dispatch(mine, 64, 200))
        assert (await asyncio.wait_for(node.assigns.get(), 10)).request_id == mine
        for word in ("a", "b", "c"):
            await node.chunk(mine, vllm_chunk(mine, MODEL, word))
        await node.abort()  # the socket is lost with the stream in flight
        await task
        again = FakeNode(
            env.orch.ws_url,
            node.node_id,
            node.token,
            models=node.models,
            in_flight=[mine],
            heartbeat_every_s=0.2,
        )
        SCRIPTED[id(env)].append(again)
        assert isinstance(await again.connect(), proto.RegisterAck)
        await env.ready(node.node_id)
        await again.done(mine, 5, 60, finish_reason="abort")  # 60 > 3 events x 4 + 16
        await again.wait_for(lambda: mine in again.acks)
        row = await poll(lambda: env.row(mine), lambda r: r is not None and r.status == "settled")
        assert row == LedgerRow("settled", 5, 3, 11)  # the relayed count, as before
        assert not await env.redis.sismember(keys.NODES_QUARANTINED, node.node_id)  # on the old code: it is
        text = await orch_metrics(env)
        assert metric(text, "llmfleet_orchestrator_nodes_quarantined_total") == 0.0
        assert metric(text, "llmfleet_orchestrator_usage_unrelayed_total") == 0.0
        assert metric(text, "llmfleet_orchestrator_usage_capped_after_lost_socket_total") == 1.0
        # Still routable: the next request goes to it (on the old code: 503, no node).
        nxt = await env.reserve(64, 16)
        nxt_task = asyncio.create_task(env.dispatch(nxt, 64, 16))
        assert (await asyncio.wait_for(again.assigns.get(), 10)).request_id == nxt
        await again.chunk(nxt, vllm_chunk(nxt, MODEL, "d", finish="stop"))
        await again.done(nxt, 7, 1, finish_reason="stop")
        assert await nxt_task == 200


async def test_a_report_beyond_what_the_node_relayed_settles_the_relayed_count(
    migrated_db_url: str, redis_url: str, tmp_path: Path
) -> None:
    async with trust_nodes(migrated_db_url, redis_url, tmp_path) as env:
        node = await scripted_node(env, f"padder-{uuid.uuid4().hex[:6]}", seqs=2)
        honest = await env.reserve(64, 200)
        task = asyncio.create_task(env.dispatch(honest, 64, 200))
        assert (await asyncio.wait_for(node.assigns.get(), 10)).request_id == honest
        for i in range(5):
            await node.chunk(honest, vllm_chunk(honest, MODEL, f"t{i}"))
        await node.done(honest, 8, 12, finish_reason="stop")  # 12 tokens over 5 events: within the tolerance
        assert await task == 200
        row = await poll(lambda: env.row(honest), lambda r: r is not None and r.status == "settled")
        assert row == LedgerRow("settled", 8, 12, 32)
        assert not await env.redis.sismember(keys.NODES_QUARANTINED, node.node_id)

        padded = await env.reserve(64, 200)
        task = asyncio.create_task(env.dispatch(padded, 64, 200))
        assert (await asyncio.wait_for(node.assigns.get(), 10)).request_id == padded
        for i in range(5):
            await node.chunk(padded, vllm_chunk(padded, MODEL, f"t{i}"))
        await node.done(padded, 8, 200, finish_reason="stop")  # the worst case, 5 tokens sent
        assert await task == 200
        row = await poll(lambda: env.row(padded), lambda r: r is not None and r.status == "settled")
        assert row == LedgerRow("settled", 8, 5, 18)  # on main: ("settled", 8, 200, 408)
        text = await orch_metrics(env)
        assert metric(text, "llmfleet_orchestrator_usage_unrelayed_total") == 1.0
        assert metric(text, "llmfleet_orchestrator_nodes_quarantined_total") == 1.0
        assert await env.redis.sismember(keys.NODES_QUARANTINED, node.node_id)
        # Out of routing: the next request finds no node (the node itself is still connected).
        third = await env.reserve(64, 16)
        assert await env.dispatch(third, 64, 16) == 503
        assert not node.closed.is_set()
