"""Node pools through the orchestrator in one process: EKS-style members `<pool>/<pod>` register
with the pool's token, and revoking the pool disconnects every member within one heartbeat."""

from __future__ import annotations

import asyncio

from apps.core.nodes import keys
from apps.core.nodes.store import decode_hash
from apps.core.protocol import node as proto
from tests.fakes.fake_node import FakeNode
from tests.integration.orchestrator_env import Env, eventually

HEARTBEAT_S = 0.5  # the orchestrator's interval in `Env`
POOL_TOKEN = "t" * 48


def member(env: Env, url: str, node_id: str, token: str = POOL_TOKEN, location: str = "cloud") -> FakeNode:
    # The pool's pods run their agents with `--location cloud`, the pool's registered location.
    node = FakeNode(url, node_id, token, location=location, heartbeat_every_s=0.2)
    env.nodes.append(node)
    return node


async def test_pool_members_register_with_the_pool_token(env: Env) -> None:
    await env.store.register_pool("eks", "cloud", POOL_TOKEN)
    orch = await env.orchestrator()
    a = member(env, orch.ws_url, "eks/vllm-8b-7d9f-aaaaa")
    b = member(env, orch.ws_url, "eks/vllm-8b-7d9f-bbbbb")
    assert isinstance(await a.connect(), proto.RegisterAck)
    assert isinstance(await b.connect(), proto.RegisterAck)
    raw = decode_hash(await env.redis.hgetall(keys.node_hash("eks/vllm-8b-7d9f-aaaaa")))
    assert raw["orchestrator_id"] == orch.plane.id
    listed = {n["node_id"]: n for n in await env.store.list_nodes()}
    assert listed["eks/vllm-8b-7d9f-aaaaa"]["location"] == "cloud"
    assert listed["eks/vllm-8b-7d9f-bbbbb"]["pool"] == "eks"
    assert listed["eks/vllm-8b-7d9f-bbbbb"]["state"] == "ready"
    # A member claiming another location than the pool's is refused, not moved.
    wrong = member(env, orch.ws_url, "eks/vllm-8b-7d9f-ccccc", location="onprem")
    refused = await wrong.connect()
    assert isinstance(refused, proto.RegisterRefused)
    assert refused.reason == "location_not_permitted"
    assert wrong.close_code == proto.CLOSE_AUTH_FAILED


async def test_the_bare_pool_id_and_wrong_tokens_are_refused(env: Env) -> None:
    await env.store.register_pool("eks", "cloud", POOL_TOKEN)
    orch = await env.orchestrator()
    for node_id, token in (("eks", POOL_TOKEN), ("eks/pod", "u" * 48), ("other/pod", POOL_TOKEN)):
        node = member(env, orch.ws_url, node_id, token)
        assert isinstance(await node.connect(), proto.RegisterRefused), node_id
        assert node.close_code == proto.CLOSE_AUTH_FAILED


async def test_revoking_the_pool_disconnects_every_member_within_one_heartbeat(env: Env) -> None:
    await env.store.register_pool("eks", "cloud", POOL_TOKEN)
    orch = await env.orchestrator()
    members = [member(env, orch.ws_url, f"eks/pod-{i}") for i in range(3)]
    for node in members:
        assert isinstance(await node.connect(), proto.RegisterAck)
    solo = await env.node(orch, "prem-1")  # a single node is not affected
    assert await env.store.revoke("eks")
    await asyncio.wait_for(asyncio.gather(*(n.closed.wait() for n in members)), 2 * HEARTBEAT_S)
    assert [n.close_code for n in members] == [proto.CLOSE_REVOKED] * 3
    assert not solo.closed.is_set()
    again = member(env, orch.ws_url, "eks/pod-0")
    assert isinstance(await again.connect(), proto.RegisterRefused)
    assert again.close_code == proto.CLOSE_AUTH_FAILED


async def test_heartbeat_check_alone_cuts_a_member_of_a_revoked_pool(env: Env) -> None:
    """Without the pub/sub message (e.g. a member that registered after the revoke listed the
    pool's members): the owner's heartbeat script sees the pool in `nodes:revoked`."""
    await env.store.register_pool("eks", "cloud", POOL_TOKEN)
    orch = await env.orchestrator()
    node = member(env, orch.ws_url, "eks/pod-late")
    assert isinstance(await node.connect(), proto.RegisterAck)
    await env.redis.sadd(keys.NODES_REVOKED, "eks")
    await asyncio.wait_for(node.closed.wait(), 2 * HEARTBEAT_S)
    assert node.close_code == proto.CLOSE_REVOKED

    async def gone() -> bool:
        return int(await env.redis.exists(keys.node_hash("eks/pod-late"))) == 0

    await eventually(gone)


async def test_a_rotated_pool_token_readmits_members(env: Env) -> None:
    await env.store.register_pool("eks", "cloud", POOL_TOKEN)
    assert await env.store.revoke("eks")
    await env.store.register_pool("eks", "cloud", "r" * 48)
    orch = await env.orchestrator()
    old = member(env, orch.ws_url, "eks/pod-old")
    assert isinstance(await old.connect(), proto.RegisterRefused)
    new = member(env, orch.ws_url, "eks/pod-new", "r" * 48)
    assert isinstance(await new.connect(), proto.RegisterAck)
