"""Two orchestrator replicas in one process sharing Redis and PostgreSQL: any replica takes
any dispatch; nodes owned by the other replica are reached through pub/sub keyed by node id."""

from __future__ import annotations

import asyncio

import aiohttp

from apps.core.ledger.api import ReservationStatus
from apps.core.nodes import keys
from apps.core.protocol import bus as msgs
from apps.core.protocol import node as proto
from apps.core.protocol.dispatch import DISPATCH_PATH
from tests.fakes.fake_node import Auto, FakeNode, vllm_chunk
from tests.ids import CHANNEL_NAMESPACE
from tests.integration.orchestrator_env import TOKEN, Env, eventually
from tests.integration.test_orchestrator_app import _done, events


async def test_dispatch_on_one_replica_runs_on_a_node_owned_by_the_other(env: Env) -> None:
    a = await env.orchestrator()
    b = await env.orchestrator()
    node = await env.node(a, "n1", auto=Auto(tokens=3, prompt_tokens=6))
    await eventually(lambda: _done(b.plane.fleet.get("n1") is not None))
    await env.ledger.add("r1")
    status, headers, body = await env.dispatch(b, "r1", client_wants_usage=True)
    assert status == 200
    assert headers["x-llmfleet-node"] == "n1"
    evs = events(body)
    assert [e for e in evs if b"t0" in e or b"t1" in e or b"t2" in e] == evs[:3]  # order kept
    assert b'"usage"' in evs[3]
    assert evs[-1] == b"[DONE]"
    await node.wait_for(lambda: "r1" in node.acks)  # the owner settled, then acknowledged
    assert env.ledger.settle_calls == [("r1", 6, 3)]
    assert a.plane.metrics.forwarded.labels(op="assign")._value.get() == 0
    assert b.plane.metrics.forwarded.labels(op="assign")._value.get() == 1


async def test_gateway_disconnect_on_the_relaying_replica_cancels_on_the_remote_node(env: Env) -> None:
    a = await env.orchestrator()
    b = await env.orchestrator()
    gate = asyncio.Event()
    node = await env.node(a, "n1", auto=Auto(tokens=4, prompt_tokens=2, gate=gate))
    await eventually(lambda: _done(b.plane.fleet.get("n1") is not None))
    await env.ledger.add("r1")
    body = {"request_id": "r1", "team_id": 1, "model": "m", "body": {"messages": []}}
    async with aiohttp.ClientSession() as session:
        resp = await session.post(
            b.url + DISPATCH_PATH, json=body, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        await resp.content.readuntil(b"\n\n")
        resp.close()
    await node.wait_for(lambda: "r1" in node.cancels)
    await node.wait_for(lambda: "r1" in node.acks)
    assert env.ledger.settle_calls == [("r1", 2, 1)]


async def test_a_node_registering_on_another_replica_supersedes_its_old_socket(env: Env) -> None:
    a = await env.orchestrator()
    b = await env.orchestrator()
    old = await env.node(a, "n1")
    new = FakeNode(b.ws_url, "n1", old.token, heartbeat_every_s=0.2)
    env.nodes.append(new)
    assert isinstance(await new.connect(), proto.RegisterAck)
    await asyncio.wait_for(old.closed.wait(), 5)
    assert old.close_code == proto.CLOSE_SUPERSEDED
    await eventually(lambda: _done("n1" not in a.plane.routing.local and "n1" in b.plane.routing.local))
    listed = await env.store.list_nodes()
    assert listed[0]["orchestrator_id"] == b.plane.id
    assert listed[0]["state"] == "ready"


async def test_owner_replica_going_away_mid_stream_ends_the_remote_relay_with_an_error_event(
    env: Env,
) -> None:
    a = await env.orchestrator()
    b = await env.orchestrator()
    node = await env.node(a, "n1")
    await eventually(lambda: _done(b.plane.fleet.get("n1") is not None))
    await env.ledger.add("r1")
    body = {"request_id": "r1", "team_id": 1, "model": "m", "body": {"messages": []}}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    post = asyncio.ensure_future(env.session.post(b.url + DISPATCH_PATH, json=body, headers=headers))
    await asyncio.wait_for(node.assigns.get(), 5)
    await node.chunk("r1", vllm_chunk("r1", "m", "partial"))
    resp = await post
    first = await resp.content.readuntil(b"\n\n")
    await a.close()
    rest = await asyncio.wait_for(resp.read(), 10)
    evs = events(first + rest)
    assert resp.status == 200
    assert b"partial" in evs[0]
    assert evs[1].startswith(b'{"error"')
    assert evs[-1] == b"[DONE]"
    assert await env.ledger.status("r1") is ReservationStatus.RESERVED  # the node or the sweeper settles it


async def test_forward_to_a_node_nobody_owns_any_more_is_retried_elsewhere(env: Env) -> None:
    a = await env.orchestrator()
    b = await env.orchestrator()
    await env.node(b, "cloud-ok", location="cloud", auto=Auto(tokens=1))
    # A stale heartbeat of an on-premises node whose owner is gone (nobody on its channel).
    ghost = await env.node(a, "prem-ghost")
    await eventually(lambda: _done(b.plane.fleet.get("prem-ghost") is not None))
    a.plane.routing.local.pop("prem-ghost")
    await a.plane.routing.bus.unsubscribe_node("prem-ghost")
    await env.ledger.add("r1")
    status, headers, _ = await env.dispatch(b, "r1")
    assert status == 200
    assert headers["x-llmfleet-node"] == "cloud-ok"
    await ghost.close()


async def test_node_capacity_holds_across_replicas(env: Env) -> None:
    a = await env.orchestrator()
    b = await env.orchestrator()
    gate = asyncio.Event()
    one_seq = [proto.ModelInfo(name="m", max_num_seqs=1, max_model_len=4096)]
    node = await env.node(a, "n1", auto=Auto(tokens=2, gate=gate), models=one_seq)
    await eventually(lambda: _done(b.plane.fleet.get("n1") is not None))
    await env.ledger.add("ra")
    await env.ledger.add("rb")
    first = asyncio.create_task(env.dispatch(a, "ra"))
    await asyncio.wait_for(node.assigns.get(), 5)
    second = asyncio.create_task(env.dispatch(b, "rb"))
    await eventually(lambda: _done(b.plane.queues.depth("m") == 1))
    assert node.assigns.empty()  # the other replica waits: the node's only slot is taken
    gate.set()
    assert (await first)[0] == 200
    assert (await second)[0] == 200
    assert [f.request_id for f in node.frames if isinstance(f, proto.Assign)] == ["ra", "rb"]


async def test_a_registration_storm_admits_only_the_burst_and_spreads_the_rest(env: Env) -> None:
    # The replica's clock stands still: on a slow machine the 20 connects took over a second of real
    # time and the bucket refilled in between (more than the burst admitted).
    frozen = {"monotonic": lambda: 1000.0}
    orch = await env.orchestrator(frozen, registrations_per_s=1.0, registration_burst=5)
    nodes = [await env.node(orch, f"n{i}", connect=False) for i in range(20)]
    answers = await asyncio.gather(*(n.connect() for n in nodes))
    acked = [a for a in answers if isinstance(a, proto.RegisterAck)]
    refused = [a for a in answers if isinstance(a, proto.RegisterRefused)]
    assert len(acked) == 5
    assert len(refused) == 15
    hints = sorted(r.retry_after_s or 0 for r in refused)
    assert hints[-1] - hints[0] >= 13  # one per second at 1/s: spread, not a second storm
    assert orch.plane.metrics.registrations_refused.labels(reason="rate_limited")._value.get() == 15


async def test_drain_reaches_a_node_through_any_replica_and_load_model_is_retired(env: Env) -> None:
    a = await env.orchestrator()
    b = await env.orchestrator()
    node = await env.node(a, "n1")
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for replica in (a, b):  # retired: 501 with a message, on the owner and elsewhere; nothing is sent
        async with env.session.post(
            replica.url + "/internal/v1/nodes/n1/load_model", json={"name": "big"}, headers=headers
        ) as r:
            assert r.status == 501
            error = (await r.json())["error"]
            assert error["code"] == "not_implemented"
            assert "restart the node's agent" in error["message"]
    async with env.session.post(a.url + "/internal/v1/nodes/n1/load_model", json={"name": "big"}) as r:
        assert r.status == 401  # the internal token still comes first
    async with env.session.post(b.url + "/internal/v1/nodes/n1/drain", headers=headers) as r:
        assert r.status == 202
    await node.wait_for(lambda: node.drains == 1)
    assert node.loads == []  # the drain went the same way after the load_model calls: none was sent

    def not_routable() -> bool:
        view = b.plane.fleet.get("n1")
        return view is None or view.state == "draining"

    await eventually(lambda: _done(not_routable()))
    async with env.session.post(b.url + "/internal/v1/nodes/ghost/drain", headers=headers) as r:
        assert r.status == 404


async def test_relaying_replica_gone_mid_stream_cancels_on_the_node_and_settles_what_ran(env: Env) -> None:
    """kill -9 of the replica relaying a stream whose node another replica owns: nobody hears the
    owner's frames any more (PUBLISH reaches no one), so the owner cancels on the node, whose
    `done(abort)` settles the tokens produced, not the full answer (before: the engine ran to the
    end for no client and the owner billed it all). The dead relay is a replica id nobody
    subscribes for, as after its process died."""
    a = await env.orchestrator()
    never = asyncio.Event()  # the node waits after its first chunk until cancelled
    node = await env.node(a, "n1", auto=Auto(tokens=50, prompt_tokens=2, gate=never))
    await env.ledger.add("r1")
    # The assignment as the killed replica recorded it when it took the node's slot
    # (`Fleet.acquire_slot`): a node's reports settle only requests assigned to it.
    await env.redis.hset(keys.request_key("r1"), mapping={"node": "n1", "origin": "orch-killed"})
    assign = msgs.AssignMsg(origin="orch-killed", request_id="r1", model="m", body={"messages": []})
    assert (
        await env.redis.publish(keys.node_channel("n1", namespace=CHANNEL_NAMESPACE), msgs.encode(assign))
        == 1
    )
    await node.wait_for(lambda: "r1" in node.cancels)
    await node.wait_for(lambda: "r1" in node.acks)
    assert env.ledger.settle_calls == [("r1", 2, 1)]
