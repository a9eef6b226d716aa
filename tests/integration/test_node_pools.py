"""Node pools through the orchestrator in one process: EKS-style members `<pool>/<pod>` register
with the pool's token, and revoking the pool disconnects every member within one heartbeat."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from apps.core.nodes import keys
from apps.core.nodes.store import decode_hash
from apps.core.protocol import node as proto
from tests.fakes.fake_node import FakeNode
from tests.integration.test_orchestrator_app import Env, eventually

HEARTBEAT_S = 0.5  # the orchestrator's interval in `Env`
POOL_TOKEN = "t" * 48


@pytest.fixture
async def penv(migrated_db_url: str, redis_url: str) -> AsyncIterator[Env]:
    pool = AsyncConnectionPool(migrated_db_url, min_size=1, max_size=8, open=False)
    await pool.open()
    redis = Redis.from_url(redis_url)
    environment = Env(pool, redis)
    try:
        yield environment
    finally:
        await environment.close()
        await redis.aclose()
        await pool.close()


def member(env: Env, url: str, node_id: str, token: str = POOL_TOKEN) -> FakeNode:
    # The agent claims "onprem" here on purpose: the pool's registered location must win.
    node = FakeNode(url, node_id, token, location="onprem", heartbeat_every_s=0.2)
    env.nodes.append(node)
    return node


async def test_pool_members_register_with_the_pool_token(penv: Env) -> None:
    await penv.store.register_pool("eks", "cloud", POOL_TOKEN)
    orch = await penv.orchestrator()
    a = member(penv, orch.ws_url, "eks/vllm-8b-7d9f-aaaaa")
    b = member(penv, orch.ws_url, "eks/vllm-8b-7d9f-bbbbb")
    assert isinstance(await a.connect(), proto.RegisterAck)
    assert isinstance(await b.connect(), proto.RegisterAck)
    raw = decode_hash(await penv.redis.hgetall(keys.node_hash("eks/vllm-8b-7d9f-aaaaa")))
    assert raw["orchestrator_id"] == orch.plane.id
    listed = {n["node_id"]: n for n in await penv.store.list_nodes()}
    assert listed["eks/vllm-8b-7d9f-aaaaa"]["location"] == "cloud"
    assert listed["eks/vllm-8b-7d9f-bbbbb"]["pool"] == "eks"
    assert listed["eks/vllm-8b-7d9f-bbbbb"]["state"] == "ready"


async def test_the_bare_pool_id_and_wrong_tokens_are_refused(penv: Env) -> None:
    await penv.store.register_pool("eks", "cloud", POOL_TOKEN)
    orch = await penv.orchestrator()
    for node_id, token in (("eks", POOL_TOKEN), ("eks/pod", "u" * 48), ("other/pod", POOL_TOKEN)):
        node = member(penv, orch.ws_url, node_id, token)
        assert isinstance(await node.connect(), proto.RegisterRefused), node_id
        assert node.close_code == proto.CLOSE_AUTH_FAILED


async def test_revoking_the_pool_disconnects_every_member_within_one_heartbeat(penv: Env) -> None:
    await penv.store.register_pool("eks", "cloud", POOL_TOKEN)
    orch = await penv.orchestrator()
    members = [member(penv, orch.ws_url, f"eks/pod-{i}") for i in range(3)]
    for node in members:
        assert isinstance(await node.connect(), proto.RegisterAck)
    solo = await penv.node(orch, "prem-1")  # a single node is not affected
    assert await penv.store.revoke("eks")
    await asyncio.wait_for(asyncio.gather(*(n.closed.wait() for n in members)), 2 * HEARTBEAT_S)
    assert [n.close_code for n in members] == [proto.CLOSE_REVOKED] * 3
    assert not solo.closed.is_set()
    again = member(penv, orch.ws_url, "eks/pod-0")
    assert isinstance(await again.connect(), proto.RegisterRefused)
    assert again.close_code == proto.CLOSE_AUTH_FAILED


async def test_heartbeat_check_alone_cuts_a_member_of_a_revoked_pool(penv: Env) -> None:
    """Without the pub/sub message (e.g. a member that registered after the revoke listed the
    pool's members): the owner's heartbeat script sees the pool in `nodes:revoked`."""
    await penv.store.register_pool("eks", "cloud", POOL_TOKEN)
    orch = await penv.orchestrator()
    node = member(penv, orch.ws_url, "eks/pod-late")
    assert isinstance(await node.connect(), proto.RegisterAck)
    await penv.redis.sadd(keys.NODES_REVOKED, "eks")
    await asyncio.wait_for(node.closed.wait(), 2 * HEARTBEAT_S)
    assert node.close_code == proto.CLOSE_REVOKED

    async def gone() -> bool:
        return int(await penv.redis.exists(keys.node_hash("eks/pod-late"))) == 0

    await eventually(gone)


async def test_a_rotated_pool_token_readmits_members(penv: Env) -> None:
    await penv.store.register_pool("eks", "cloud", POOL_TOKEN)
    assert await penv.store.revoke("eks")
    await penv.store.register_pool("eks", "cloud", "r" * 48)
    orch = await penv.orchestrator()
    old = member(penv, orch.ws_url, "eks/pod-old")
    assert isinstance(await old.connect(), proto.RegisterRefused)
    new = member(penv, orch.ws_url, "eks/pod-new", "r" * 48)
    assert isinstance(await new.connect(), proto.RegisterAck)
