"""The audit trail from the node's word to the settle (issue 30 item 4), on real Redis: a node's
registered revision is published with its heartbeat, `acquire_slot` records it with the
assignment, the settle script hands it (and the node) to the ledger settle and into the done record
the sweeper bills from; a retry on a node that names no revision does not keep the first node's."""

from __future__ import annotations

import json
import uuid

from redis.asyncio import Redis

from apps.core.nodes import keys
from apps.orchestrator.connection import NodeConnection
from apps.orchestrator.fleet import Fleet
from apps.orchestrator.settle import SettleJob
from tests.integration.test_settle_second_report import MODEL, Recorder, _settler


async def _registered(fleet: Fleet, node: str, revisions: dict[str, str]) -> NodeConnection:
    conn = NodeConnection(
        node_id=node, location="onprem", gpus=1, models={MODEL: 4}, send_limit=8, revisions=revisions
    )
    await fleet.write_heartbeat(node, conn.conn_id, conn.hash_fields("replica-a"), register=True)
    return conn


async def test_the_revision_a_node_serves_is_settled_with_its_requests(redis_url: str) -> None:
    redis = Redis.from_url(redis_url)
    try:
        settle = Recorder()
        settler = await _settler(redis, settle)
        fleet = Fleet(redis, heartbeat_interval_s=1, heartbeat_ttl_s=3, missed_heartbeats=3, max_request_s=60)
        tag = uuid.uuid4().hex[:6]
        new, old = f"canary-{tag}", f"older-{tag}"
        conns = {new: await _registered(fleet, new, {MODEL: "rev-2"}), old: await _registered(fleet, old, {})}
        await fleet.refresh()
        new_view, old_view = fleet.get(new), fleet.get(old)
        assert new_view is not None
        assert new_view.revisions == {MODEL: "rev-2"}
        assert old_view is not None
        assert old_view.revisions == {}

        rid = f"rev-{uuid.uuid4().hex[:10]}"
        assert await fleet.acquire_slot(new_view, MODEL, rid, "replica-a") == 1
        assert await redis.hget(keys.request_key(rid), "revision") == b"rev-2"
        # Retried on the older node (the first refused it): its revision is not the first node's.
        assert await fleet.acquire_slot(old_view, MODEL, rid, "replica-a") == 1
        assert await redis.hget(keys.request_key(rid), "revision") is None
        assert await fleet.acquire_slot(new_view, MODEL, rid, "replica-a") == 1

        conn = conns[new]
        conn.assigned(rid, object())  # type: ignore[arg-type]
        conn.relayed[rid] = 3
        await settler.handle(SettleJob(new, rid, 5, 3, None, relayed=conn.relayed.pop(rid), source=conn))
        assert settle.calls == [(rid, 5, 3)]
        assert settle.provenance == [(new, "rev-2")]
        record = json.loads(await redis.get(keys.done_key(rid)) or "{}")
        assert (record["node"], record["revision"]) == (new, "rev-2")  # what the sweeper bills from
    finally:
        await redis.aclose()
