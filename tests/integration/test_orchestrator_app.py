"""The orchestrator end to end in one process: real Redis and PostgreSQL, scripted nodes
over real WebSockets, the dispatch endpoint over real HTTP, an in-memory ledger."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from redis.asyncio import Redis

from apps.core.ledger.api import ReservationStatus
from apps.core.nodes import keys
from apps.core.nodes.store import decode_hash
from apps.core.protocol import node as proto
from apps.core.protocol.dispatch import DISPATCH_PATH, DispatchRequest
from apps.orchestrator.app import build_deps
from apps.orchestrator.scheduling.view import NodeView
from apps.orchestrator.settings import OrchestratorSettings
from apps.orchestrator.streams import RequestStream
from tests.fakes.fake_node import Auto, vllm_chunk
from tests.integration.orchestrator_env import TOKEN, Env, eventually


def events(body: bytes) -> list[bytes]:
    return [e.removeprefix(b"data: ") for e in body.split(b"\n\n") if e]


# -- registration ----------------------------------------------------------------------


async def test_register_ack_writes_heartbeat_hash_and_registration_row(env: Env) -> None:
    orch = await env.orchestrator()
    node = await env.node(orch, "n1")
    raw = decode_hash(await env.redis.hgetall(keys.node_hash("n1")))
    assert raw["orchestrator_id"] == orch.plane.id
    assert 0 < await env.redis.ttl(keys.node_hash("n1")) <= 15
    async with env.pool.connection() as conn:
        row = await (
            await conn.execute("SELECT location::text, orchestrator_id, state::text FROM nodes")
        ).fetchone()
    assert row == ("onprem", orch.plane.id, "registered")
    listed = await env.store.list_nodes()
    assert [(n["node_id"], n["state"], n["orchestrator_id"]) for n in listed] == [
        ("n1", "ready", orch.plane.id)
    ]
    await node.close()


async def test_unknown_protocol_version_is_closed_with_4001(env: Env) -> None:
    orch = await env.orchestrator()
    node = await env.node(orch, "n1", connect=False, version=99)
    answer = await node.connect()
    assert isinstance(answer, proto.RegisterRefused)
    assert "version" in answer.reason
    assert node.close_code == proto.CLOSE_UNSUPPORTED_VERSION


async def test_a_node_serving_no_model_is_refused_with_4002(env: Env) -> None:
    """Issue 27 item 10: `models: []` was registered (a node counted in the fleet that no request
    can be routed to); now the register frame is invalid: closed with 4002, nothing recorded."""
    orch = await env.orchestrator()
    token = await env.store.issue_token("n1", "onprem")
    frame = {"type": "register", "node_id": "n1", "token": token, "version": proto.PROTOCOL_VERSION}
    async with env.session.ws_connect(orch.ws_url) as ws:
        await ws.send_str(json.dumps({**frame, "gpus": 1, "models": []}))
        msg = await ws.receive(timeout=10)
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)
        assert ws.close_code == proto.CLOSE_PROTOCOL_ERROR
    assert await env.redis.exists(keys.node_hash("n1")) == 0
    async with env.pool.connection() as conn:
        assert await (await conn.execute("SELECT count(*) FROM nodes")).fetchone() == (0,)
    # The same node with a model registers.
    node = await env.node(orch, "n2")
    assert await env.redis.exists(keys.node_hash("n2")) == 1
    await node.close()


async def test_wrong_and_revoked_tokens_are_refused_with_4003(env: Env) -> None:
    orch = await env.orchestrator()
    node = await env.node(orch, "n1", connect=False)
    node.token = "nt-lf-wrong"
    assert isinstance(await node.connect(), proto.RegisterRefused)
    assert node.close_code == proto.CLOSE_AUTH_FAILED
    good = await env.store.issue_token("n1", "onprem")
    await env.store.revoke("n1")
    node.token = good
    assert isinstance(await node.connect(), proto.RegisterRefused)
    assert node.close_code == proto.CLOSE_AUTH_FAILED


async def test_registration_rate_limit_refuses_with_spread_retry_hints(env: Env) -> None:
    orch = await env.orchestrator(registrations_per_s=0.5, registration_burst=2)
    await env.node(orch, "a")
    await env.node(orch, "b")
    hints = []
    for name in ("c", "d", "e"):
        node = await env.node(orch, name, connect=False)
        answer = await node.connect()
        assert isinstance(answer, proto.RegisterRefused)
        assert node.close_code == proto.CLOSE_REGISTRATION_REFUSED
        assert answer.retry_after_s is not None
        hints.append(answer.retry_after_s)
    assert hints == sorted(hints)
    assert hints[2] - hints[0] >= 3.0


async def test_revoked_node_is_disconnected_within_one_heartbeat_interval(env: Env) -> None:
    orch = await env.orchestrator()
    node = await env.node(orch, "n1")
    assert await env.store.revoke("n1")
    await asyncio.wait_for(node.closed.wait(), 0.5 + 0.5)
    assert node.close_code == proto.CLOSE_REVOKED


async def test_missed_heartbeats_take_the_node_out_of_routing(env: Env) -> None:
    orch = await env.orchestrator()
    node = await env.node(orch, "n1", heartbeat_every_s=None)  # never heartbeats
    await asyncio.wait_for(node.closed.wait(), 5)
    assert node.close_code == 4008
    await eventually(lambda: _gone(env.redis, "n1"))
    listed = await env.store.list_nodes()
    assert listed[0]["state"] == "dead"


# -- dispatch -------------------------------------------------------------------------


async def test_dispatch_streams_chunks_usage_and_done_then_settles_and_acks(env: Env) -> None:
    orch = await env.orchestrator()
    node = await env.node(orch, "n1", auto=Auto(tokens=3, prompt_tokens=7))
    await env.ledger.add("r1")
    status, headers, body = await env.dispatch(orch, "r1", client_wants_usage=True)
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    evs = events(body)
    assert len(evs) == 5
    assert evs[-1] == b"[DONE]"
    assert b'"usage"' in evs[3]
    assert b'"choices":[]' in evs[3]
    await node.wait_for(lambda: "r1" in node.acks)
    assert env.ledger.settle_calls == [("r1", 7, 3)]
    assert await env.ledger.status("r1") is ReservationStatus.SETTLED


async def test_a_batched_message_is_relayed_in_order_then_settled_and_the_slot_freed(env: Env) -> None:
    _, node, task, assign = await env.assigned()
    assert await env.redis.zcard(keys.node_inflight("n1")) == 1
    await node.send_batch(
        [
            proto.Chunk(request_id=assign.request_id, delta=vllm_chunk("r1", "m", "one")),
            proto.Heartbeat(queue_depth=0, kv_cache_usage=0.0),
            proto.Chunk(request_id=assign.request_id, delta=vllm_chunk("r1", "m", "two")),
            proto.Done(
                request_id=assign.request_id, prompt_tokens=5, completion_tokens=2, finish_reason="stop"
            ),
        ]
    )
    status, _, body = await task
    evs = events(body)
    assert status == 200
    assert b"one" in evs[0]
    assert b"two" in evs[1]
    assert evs[-1] == b"[DONE]"
    await node.wait_for(lambda: "r1" in node.acks)
    assert env.ledger.settle_calls == [("r1", 5, 2)]
    assert await env.redis.zcard(keys.node_inflight("n1")) == 0  # freed by the settle job's script


@pytest.mark.parametrize(("version", "sizes"), [(2, [3]), (1, [1, 1, 1])])
async def test_frames_queued_together_reach_a_version_2_node_as_one_message(
    env: Env, version: int, sizes: list[int]
) -> None:
    orch = await env.orchestrator()
    node = await env.node(orch, "n1", version=version)
    before = len(node.message_sizes)
    conn = orch.plane.routing.local["n1"]
    for i in range(3):  # queued in one go, before the writer runs
        assert conn.send(proto.Cancel(request_id=f"x{i}"))
    await node.wait_for(lambda: len(node.cancels) == 3)
    assert node.cancels == ["x0", "x1", "x2"]
    assert node.message_sizes[before:] == sizes


async def test_usage_chunk_is_stripped_when_the_client_did_not_ask(env: Env) -> None:
    orch = await env.orchestrator()
    await env.node(orch, "n1", auto=Auto(tokens=2))
    await env.ledger.add("r1")
    status, _, body = await env.dispatch(orch, "r1")
    assert status == 200
    assert not any(b'"usage"' in e for e in events(body))
    assert events(body)[-1] == b"[DONE]"


async def test_dispatch_needs_the_internal_token_and_a_catalog_model(env: Env) -> None:
    orch = await env.orchestrator()
    async with env.session.post(orch.url + DISPATCH_PATH, json={}) as resp:
        assert resp.status == 401
    status, _, body = await env.dispatch(orch, "r1", model="nope")
    assert status == 404
    assert json.loads(body)["error"]["param"] == "model"


async def test_queue_wait_limit_gives_503_with_retry_after_and_cancels_the_reservation(env: Env) -> None:
    orch = await env.orchestrator()
    await env.ledger.add("r1")
    loop = asyncio.get_running_loop()
    sent = loop.time()
    status, headers, body = await env.dispatch(orch, "r1", deadlines={"queue_wait_s": 0.3})
    elapsed = loop.time() - sent
    assert status == 503
    assert headers["Retry-After"] == "30"  # no node serves the model: a scale-from-zero takes minutes
    assert json.loads(body)["error"]["code"] == "queue_timeout"
    # The limit runs from the request's arrival, so the answer came no sooner; the time in the queue
    # is part of it (what ran before the queue, on a loaded machine, is not: no lower bound on it).
    assert elapsed >= 0.3
    assert 0 < float(headers["x-llmfleet-queue-wait"]) <= elapsed
    assert await env.ledger.status("r1") is ReservationStatus.CANCELLED


async def test_a_full_node_gives_the_short_retry_hint(env: Env) -> None:
    orch = await env.orchestrator()
    node = await env.node(orch, "n1")  # serves "m" with 4 sequences, and answers nothing
    running = [asyncio.create_task(env.dispatch(orch, f"f{i}")) for i in range(4)]
    for _ in running:
        await asyncio.wait_for(node.assigns.get(), 5)
    status, headers, _ = await env.dispatch(orch, "r5", deadlines={"queue_wait_s": 0.3})
    assert status == 503
    assert headers["Retry-After"] == "5"  # a node serves it, it is only busy
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)


async def test_onprem_nodes_fill_first(env: Env) -> None:
    orch = await env.orchestrator()
    await env.node(orch, "cloud-1", location="cloud", auto=Auto())
    await env.node(orch, "prem-1", location="onprem", auto=Auto())
    await env.ledger.add("r1")
    loop = asyncio.get_running_loop()
    sent = loop.time()
    status, headers, _ = await env.dispatch(orch, "r1")
    elapsed = loop.time() - sent
    assert status == 200
    assert headers["x-llmfleet-node"] == "prem-1"
    assert 0 <= float(headers["x-llmfleet-queue-wait"]) <= elapsed  # a node had room: no wait beyond the call


async def test_capacity_queue_serves_in_order_when_slots_free(env: Env) -> None:
    orch = await env.orchestrator()
    gate = asyncio.Event()
    model = [proto.ModelInfo(name="m", max_num_seqs=1, max_model_len=4096)]
    await env.node(orch, "n1", auto=Auto(tokens=2, gate=gate), models=model)
    first = asyncio.create_task(env.dispatch(orch, "r1"))
    await eventually(lambda: _done(any(n.in_flight == 1 for n in orch.plane.fleet.snapshot())))
    second = asyncio.create_task(env.dispatch(orch, "r2"))
    await eventually(lambda: _done(orch.plane.queues.depth("m") == 1))
    gate.set()
    assert (await first)[0] == 200
    assert (await second)[0] == 200


async def _done(value: bool) -> bool:
    return value


async def _gone(redis: Redis, node_id: str) -> bool:
    return int(await redis.exists(keys.node_hash(node_id))) == 0


async def test_silent_node_hits_first_token_timeout_and_the_request_is_retried_elsewhere(env: Env) -> None:
    orch = await env.orchestrator()
    silent = await env.node(orch, "prem-silent", location="onprem")
    await env.node(orch, "cloud-ok", location="cloud", auto=Auto(tokens=2))
    await env.ledger.add("r1")
    status, headers, _body = await env.dispatch(orch, "r1", deadlines={"first_token_s": 0.3})
    assert status == 200
    assert headers["x-llmfleet-node"] == "cloud-ok"
    await silent.wait_for(lambda: "r1" in silent.cancels)
    # A late `done` from the first node is acknowledged but not billed: the retry bills.
    await silent.done("r1", 5, 0, finish_reason="abort")
    await silent.wait_for(lambda: "r1" in silent.acks)
    assert [c for c in env.ledger.settle_calls if c[0] == "r1"] == [("r1", 5, 2)]


async def test_node_lost_before_the_first_chunk_is_retried_once_on_another_node(env: Env) -> None:
    orch = await env.orchestrator()
    doomed = await env.node(orch, "prem-doomed", location="onprem")
    await env.node(orch, "cloud-ok", location="cloud", auto=Auto(tokens=2))
    await env.ledger.add("r1")
    task = asyncio.create_task(env.dispatch(orch, "r1"))
    await asyncio.wait_for(doomed.assigns.get(), 5)
    await doomed.abort()
    status, headers, _ = await task
    assert status == 200
    assert headers["x-llmfleet-node"] == "cloud-ok"


async def test_assignments_that_reached_no_node_do_not_use_up_the_retry_budget(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two assignments in a row reach no node (`start` False: a socket moving between replicas, a
    channel nobody hears): nothing ran, so the request goes on to a third node and completes. With
    them counted against `MAX_ATTEMPTS` (2) it was refused 503 "unreachable"."""
    orch = await env.orchestrator()
    for name in ("n1", "n2", "n3"):
        await env.node(orch, name, auto=Auto(tokens=2))
    real_start = orch.plane.routing.start
    tried: list[str] = []

    async def unreachable_twice(node: NodeView, dreq: DispatchRequest, stream: RequestStream) -> bool:
        tried.append(node.node_id)
        if len(tried) <= 2:
            return False
        return await real_start(node, dreq, stream)

    monkeypatch.setattr(orch.plane.routing, "start", unreachable_twice)
    await env.ledger.add("r1")
    status, headers, body = await env.dispatch(orch, "r1")
    assert status == 200, body
    assert len(set(tried)) == 3  # each retry on a node not tried yet
    assert headers["x-llmfleet-node"] == tried[-1]
    assert events(body)[-1] == b"[DONE]"
    await eventually(lambda: _done(env.ledger.settle_calls == [("r1", 5, 2)]))


async def test_node_lost_mid_stream_gives_error_event_and_done_and_a_partial_record(env: Env) -> None:
    orch = await env.orchestrator(resume_models=frozenset())  # resume off (test_orchestrator_resume.py)
    node = await env.node(orch, "n1")
    await env.node(orch, "n2", location="cloud", auto=Auto())
    await env.ledger.add("r1")
    task = asyncio.create_task(env.dispatch(orch, "r1", max_prompt_tokens=12, max_completion_tokens=50))
    assign = await asyncio.wait_for(node.assigns.get(), 5)
    await node.chunk(assign.request_id, vllm_chunk("r1", "m", "hello"))
    await node.chunk(assign.request_id, vllm_chunk("r1", "m", " world"))
    await eventually(lambda: _done(orch.plane.routing.local["n1"].routes.get("r1") is not None))
    await node.abort()
    status, headers, body = await task
    evs = events(body)
    assert status == 200
    assert headers["x-llmfleet-node"] == "n1"
    assert b"hello" in evs[0]
    assert b" world" in evs[1]
    assert evs[2].startswith(b'{"error"')
    assert evs[-1] == b"[DONE]"
    partial = json.loads(await env.redis.get(keys.partial_key("r1")) or "null")
    # The prompt as reserved (the prefill ran; no exact count reached the orchestrator), one token
    # per relayed event as the floor of the completion (sweeper.partial_usage).
    assert (partial["prompt_tokens"], partial["completion_tokens"]) == (12, 2)


async def test_engine_refusal_before_output_passes_the_status_through(env: Env) -> None:
    _, node, task, _ = await env.assigned()
    await node.error(
        "r1", 400, "max_tokens is too large", error_type="invalid_request_error", param="max_tokens"
    )
    status, _, body = await task
    assert status == 400
    assert json.loads(body)["error"]["param"] == "max_tokens"
    assert await env.ledger.status("r1") is ReservationStatus.CANCELLED


async def test_drain_stops_assignments_and_the_node_leaves_after_in_flight(env: Env) -> None:
    orch = await env.orchestrator()
    gate = asyncio.Event()
    node = await env.node(orch, "n1", auto=Auto(tokens=2, gate=gate))
    await env.ledger.add("r1")
    running = asyncio.create_task(env.dispatch(orch, "r1"))
    await asyncio.wait_for(node.assigns.get(), 5)
    async with env.session.post(
        orch.url + "/internal/v1/nodes/n1/drain", headers={"Authorization": f"Bearer {TOKEN}"}
    ) as resp:
        assert resp.status == 202
    await node.wait_for(lambda: node.drains == 1)
    status, _, _ = await env.dispatch(orch, "r2", deadlines={"queue_wait_s": 0.3})
    assert status == 503  # the draining node gets nothing new
    gate.set()
    assert (await running)[0] == 200
    await node.drained()
    # `drained` is the node's last frame: the orchestrator, having read it (and so everything
    # before it), closes the socket; the node waits for that close instead of closing first.
    await asyncio.wait_for(node.closed.wait(), 5)
    assert node.close_code == 1000
    await node.close()
    async with env.pool.connection() as conn:
        row = await (await conn.execute("SELECT state::text, drained_at IS NOT NULL FROM nodes")).fetchone()
    assert row == ("drained", True)


async def test_metrics_expose_queue_depth_per_catalog_model_and_live_tasks(env: Env) -> None:
    orch = await env.orchestrator()
    async with env.session.get(orch.url + "/metrics") as resp:
        text = await resp.text()
    assert 'llmfleet_orchestrator_queue_depth{model="big"} 0.0' in text
    assert "llmfleet_orchestrator_asyncio_tasks" in text
    async with env.session.get(orch.url + "/readyz") as resp:
        assert resp.status == 200


async def test_metrics_need_the_metrics_token_when_one_is_set(env: Env) -> None:
    """Issue 27: orchestrator metrics carry team ids; a scrape then needs the token."""
    orch = await env.orchestrator(metrics_token="scrape-secret")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {TOKEN}"}):
        async with env.session.get(orch.url + "/metrics", headers=headers) as resp:
            assert resp.status == 401, headers
            assert (await resp.json())["error"]["code"] == "invalid_metrics_token"
    async with env.session.get(
        orch.url + "/metrics", headers={"Authorization": "Bearer scrape-secret"}
    ) as resp:
        assert resp.status == 200
        assert "llmfleet_orchestrator_queue_depth" in await resp.text()


async def test_build_deps_sizes_the_postgres_pool_from_settings(
    migrated_db_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMFLEET_PG_POOL_MAX", "3")
    settings = OrchestratorSettings(
        database_url=migrated_db_url, redis_url=redis_url, secret_key="s", internal_token="t"
    )
    deps, pool = await build_deps(settings)
    try:
        assert settings.pg_pool_max == 3
        assert pool.max_size == 3
    finally:
        await deps.redis.aclose()
        await pool.close()
    with pytest.raises(ValueError, match="pg_pool_max"):
        OrchestratorSettings(pg_pool_max=0)
