"""`NodeStore` node pools against real PostgreSQL and Redis: one token admits `<pool>/<instance>`."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from apps.core.errors import InvalidRequest
from apps.core.nodes import keys
from apps.core.nodes.ids import parse_node_id, pool_of
from apps.core.nodes.store import PoolStatus
from apps.core.secrets import hash_secret
from tests.ids import CHANNEL_NAMESPACE
from tests.integration.nodestore_env import SECRET, Store, node_store

POOL_TOKEN = "p" * 48


@pytest.fixture
async def store(migrated_db_url: str, redis_url: str) -> AsyncIterator[Store]:
    async with node_store(migrated_db_url, redis_url) as s:
        yield s


def test_node_id_parsing() -> None:
    assert parse_node_id("gpu-1") is not None
    assert pool_of("gpu-1") is None
    ref = parse_node_id("eks/vllm-8b-7d9f-abcde")
    assert ref is not None
    assert (ref.token_id, ref.pool) == ("eks", "eks")
    for bad in ("", "/x", "eks/", "eks/a/b", "x" * 129):
        assert parse_node_id(bad) is None, bad


async def test_pool_token_admits_members_only(store: Store) -> None:
    nodes, _, _ = store
    token = await nodes.issue_token("eks", "cloud", pool=True)
    who = await nodes.identify("eks/vllm-8b-7d9f-abcde", token)
    assert who is not None
    assert (who.node_id, who.location, who.pool) == ("eks/vllm-8b-7d9f-abcde", "cloud", "eks")
    assert await nodes.verify("eks/another-pod", token)
    assert not await nodes.verify("eks", token)  # the bare pool id is not a node
    assert not await nodes.verify("eks/", token)
    assert not await nodes.verify("eks/a/b", token)
    assert not await nodes.verify("eks/pod", token + "x")
    assert not await nodes.verify("other/pod", token)


async def test_a_node_token_admits_no_members(store: Store) -> None:
    nodes, _, _ = store
    token = await nodes.issue_token("gpu-1", "onprem")
    assert await nodes.verify("gpu-1", token)  # unchanged behaviour
    assert not await nodes.verify("gpu-1/x", token)


async def test_ids_with_a_slash_cannot_hold_a_token(store: Store) -> None:
    nodes, _, _ = store
    for bad in ("eks/pod", "a/b"):
        with pytest.raises(InvalidRequest) as err:
            await nodes.issue_token(bad, "cloud")
        assert err.value.param == "node_id"
        with pytest.raises(InvalidRequest) as err:
            await nodes.register_pool(bad, "cloud", POOL_TOKEN)
        assert err.value.param == "pool"


async def test_a_live_id_keeps_its_kind(store: Store) -> None:
    nodes, _, _ = store
    await nodes.issue_token("gpu-1", "onprem")
    with pytest.raises(InvalidRequest, match="live node token"):
        await nodes.issue_token("gpu-1", "onprem", pool=True)
    with pytest.raises(InvalidRequest, match="live node token"):
        await nodes.register_pool("gpu-1", "onprem", POOL_TOKEN)
    assert await nodes.revoke("gpu-1")
    token = await nodes.issue_token("gpu-1", "onprem", pool=True)  # after a revoke: allowed
    assert await nodes.verify("gpu-1/a", token)


async def test_register_pool_is_idempotent_rotates_and_respects_revocation(store: Store) -> None:
    nodes, pool, redis = store
    first = await nodes.register_pool("eks", "cloud", POOL_TOKEN)
    assert first.status is PoolStatus.CREATED
    assert (await nodes.register_pool("eks", "cloud", POOL_TOKEN)).status is PoolStatus.UNCHANGED
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT token_hash, kind FROM node_tokens WHERE node_id = 'eks'")
        assert await cur.fetchone() == (hash_secret(POOL_TOKEN, SECRET), "pool")
    assert await nodes.verify("eks/pod-a", POOL_TOKEN)

    assert await nodes.revoke("eks")
    assert not await nodes.verify("eks/pod-a", POOL_TOKEN)
    # A re-run of the deploy Job with the same (revoked) token does not undo the revoke.
    assert (await nodes.register_pool("eks", "cloud", POOL_TOKEN)).status is PoolStatus.REVOKED
    assert not await nodes.verify("eks/pod-a", POOL_TOKEN)
    assert await redis.sismember(keys.NODES_REVOKED, "eks")

    rotated = "q" * 48
    assert (await nodes.register_pool("eks", "cloud", rotated)).status is PoolStatus.ROTATED
    assert await nodes.verify("eks/pod-a", rotated)
    assert not await nodes.verify("eks/pod-a", POOL_TOKEN)
    assert not await redis.sismember(keys.NODES_REVOKED, "eks")


async def test_register_pool_refuses_short_tokens_and_bad_locations(store: Store) -> None:
    nodes, _, _ = store
    with pytest.raises(InvalidRequest, match="at least 32"):
        await nodes.register_pool("eks", "cloud", "short")
    with pytest.raises(InvalidRequest) as err:
        await nodes.register_pool("eks", "moon", POOL_TOKEN)
    assert err.value.param == "location"


async def test_revoking_a_pool_revokes_every_member_and_signals_their_owners(store: Store) -> None:
    nodes, _, redis = store
    token = await nodes.issue_token("eks", "cloud", pool=True)
    for member in ("eks/pod-a", "eks/pod-b"):
        await nodes.record_registration(
            node_id=member, location="cloud", gpus=1, models=[{"name": "m"}], orchestrator_id="o"
        )
    await nodes.issue_token("eksx", "cloud")  # a prefix look-alike is not a member
    await nodes.record_registration(node_id="eksx", location="cloud", gpus=1, models=[], orchestrator_id="o")
    pubsub = redis.pubsub()
    channels = [
        keys.node_channel(n, namespace=CHANNEL_NAMESPACE) for n in ("eks", "eks/pod-a", "eks/pod-b", "eksx")
    ]
    await pubsub.subscribe(*channels)
    try:
        assert not await nodes.revoke("eks/pod-a")  # members have no token of their own
        assert await nodes.revoke("eks")
        got: set[str] = set()
        deadline = time.monotonic() + 5
        while len(got) < 3 and time.monotonic() < deadline:
            msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
            if msg is not None:
                got.add(msg["channel"].decode())
        assert got == {
            keys.node_channel(n, namespace=CHANNEL_NAMESPACE) for n in ("eks", "eks/pod-a", "eks/pod-b")
        }
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
    assert not await nodes.verify("eks/pod-c", token)
    listed = {n["node_id"]: n for n in await nodes.list_nodes()}
    assert listed["eks"]["kind"] == "pool"
    assert listed["eks"]["state"] == "revoked"
    for member in ("eks/pod-a", "eks/pod-b"):
        assert listed[member]["state"] == "revoked"
        assert listed[member]["pool"] == "eks"
        assert listed[member]["kind"] == "node"
    assert listed["eksx"]["state"] == "dead"
    assert listed["eksx"]["pool"] is None


async def test_listing_shows_a_live_member_under_its_pool(store: Store) -> None:
    nodes, _, redis = store
    await nodes.issue_token("eks", "cloud", pool=True)
    await nodes.record_registration(
        node_id="eks/pod-a", location="cloud", gpus=2, models=[{"name": "m"}], orchestrator_id="o"
    )
    await redis.hset(keys.node_hash("eks/pod-a"), mapping={"conn": "c", "ts": time.time(), "draining": "0"})
    listed = {n["node_id"]: n for n in await nodes.list_nodes()}
    assert set(listed) == {"eks", "eks/pod-a"}
    member = listed["eks/pod-a"]
    assert (member["state"], member["gpus"], member["models"], member["location"]) == (
        "ready",
        2,
        ["m"],
        "cloud",
    )


async def test_listing_forgets_pool_members_gone_for_a_day_but_not_single_nodes(store: Store) -> None:
    nodes, pool, _ = store
    await nodes.issue_token("eks", "cloud", pool=True)
    await nodes.issue_token("gpu-1", "onprem")
    for node_id in ("eks/old-pod", "eks/recent-pod", "gpu-1"):
        await nodes.record_registration(
            node_id=node_id, location="cloud", gpus=1, models=[], orchestrator_id="o"
        )
        await nodes.record_event(node_id, "disconnected", "o")
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE nodes SET last_seen = now() - interval '25 hours' WHERE id IN ('eks/old-pod', 'gpu-1')"
        )
    listed = {n["node_id"] for n in await nodes.list_nodes()}
    assert listed == {"eks", "eks/recent-pod", "gpu-1"}
