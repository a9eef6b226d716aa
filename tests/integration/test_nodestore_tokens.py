"""`NodeStore` against real PostgreSQL and Redis: tokens hashed, revocable, and the listing."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import pytest

from apps.core.errors import InvalidRequest
from apps.core.nodes import keys
from tests.ids import CHANNEL_NAMESPACE
from tests.integration.nodestore_env import Store, node_store


@pytest.fixture
async def store(migrated_db_url: str, redis_url: str) -> AsyncIterator[Store]:
    async with node_store(migrated_db_url, redis_url) as s:
        yield s


async def test_token_is_returned_once_and_stored_only_as_a_hash(
    store: Store,
) -> None:
    nodes, pool, _ = store
    token = await nodes.issue_token("gpu-1", "onprem")
    assert token.startswith("nt-lf-")
    assert len(token) > 40
    async with pool.connection() as conn:
        row = await (
            await conn.execute("SELECT token_hash FROM node_tokens WHERE node_id = 'gpu-1'")
        ).fetchone()
    assert row is not None
    assert token not in row[0]
    assert len(row[0]) == 64
    assert await nodes.verify("gpu-1", token)
    assert not await nodes.verify("gpu-1", token + "x")
    assert not await nodes.verify("gpu-2", token)


async def test_revoke_then_reissue(store: Store) -> None:
    nodes, _, redis = store
    old = await nodes.issue_token("gpu-1", "cloud")
    assert await nodes.revoke("gpu-1")
    assert not await nodes.revoke("gpu-1")  # already revoked
    assert not await nodes.verify("gpu-1", old)
    assert await redis.sismember(keys.NODES_REVOKED, "gpu-1")
    listed = await nodes.list_nodes()
    assert listed[0]["state"] == "revoked"
    new = await nodes.issue_token("gpu-1", "cloud")
    assert await nodes.verify("gpu-1", new)
    assert not await nodes.verify("gpu-1", old)
    assert not await redis.sismember(keys.NODES_REVOKED, "gpu-1")


async def test_bad_location_or_node_id_is_a_400(store: Store) -> None:
    nodes, _, _ = store
    with pytest.raises(InvalidRequest) as err:
        await nodes.issue_token("gpu-1", "moon")
    assert err.value.param == "location"
    with pytest.raises(InvalidRequest):
        await nodes.issue_token("", "cloud")


async def test_list_nodes_merges_registration_and_live_heartbeat(
    store: Store,
) -> None:
    nodes, _, redis = store
    await nodes.issue_token("gpu-1", "onprem")
    await nodes.issue_token("gpu-2", "cloud")
    await nodes.record_registration(
        node_id="gpu-1",
        location="onprem",
        gpus=4,
        models=[{"name": "m", "max_num_seqs": 8, "max_model_len": 4096}],
        orchestrator_id="orch-a",
    )
    await redis.hset(
        keys.node_hash("gpu-1"),
        mapping={
            "conn": "c1",
            "orchestrator_id": "orch-a",
            "ts": time.time(),
            "queue_depth": 2,
            "kv_cache_usage": 0.25,
            "gpu_util": "",
            "draining": "0",
            "models": json.dumps({"m": 8}),
        },
    )
    await redis.zadd(keys.node_inflight("gpu-1"), {"r1": time.time() + 60, "r-expired": time.time() - 1})
    listed = {n["node_id"]: n for n in await nodes.list_nodes()}
    one = listed["gpu-1"]
    assert one["state"] == "ready"
    assert one["models"] == ["m"]
    assert one["gpus"] == 4
    assert one["queue_depth"] == 2
    assert one["kv_cache_usage"] == 0.25
    assert one["gpu_util"] is None
    assert one["in_flight"] == 1
    assert one["orchestrator_id"] == "orch-a"
    assert isinstance(one["last_heartbeat_age_s"], float)
    assert one["last_heartbeat_age_s"] < 5
    assert listed["gpu-2"]["state"] == "dead"
    assert listed["gpu-2"]["last_heartbeat_age_s"] is None
    await nodes.record_event("gpu-1", "draining", "orch-a")
    assert {n["node_id"]: n for n in await nodes.list_nodes()}["gpu-1"]["state"] == "draining"


async def test_request_drain_reports_whether_any_replica_owns_the_node(
    store: Store,
) -> None:
    nodes, _, redis = store
    assert not await nodes.request_drain("gpu-1")
    pubsub = redis.pubsub()
    await pubsub.subscribe(keys.node_channel("gpu-1", namespace=CHANNEL_NAMESPACE))
    try:
        assert await nodes.request_drain("gpu-1")
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]


async def test_migration_is_idempotent(migrated_db_url: str) -> None:
    from apps.core.db.migrate import migrate_sync

    assert migrate_sync(migrated_db_url) == []
