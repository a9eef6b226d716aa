"""Two runs of the platform (two test suites, or a suite and `llmfleet dev`) on one Redis server,
each in its own logical database: pub/sub channels are server-wide, not per database, so each run
names its channels in its own namespace (`LLMFLEET_CHANNEL_NAMESPACE`). The same node id (`n1`)
or orchestrator id in both runs then reaches only its own run's replicas."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis as sync_redis
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from apps.core.db.migrate import migrate_sync
from apps.core.db.scratch import scratch_database
from apps.core.protocol import bus as msgs
from tests.conftest import _redis_db_url, claimed_redis_db
from tests.ids import unique
from tests.integration.orchestrator_env import Env
from tests.integration.recorded_ledger import RecordedLedger

OTHER_NAMESPACE = unique("other-run")  # never another run's


@pytest.fixture
async def other_run(pg_admin_url: str, redis_base_url: str) -> AsyncIterator[Env]:
    """A second platform on the same servers: its own scratch database, its own Redis DB."""
    with scratch_database(pg_admin_url, "llmfleet_test") as db_url, claimed_redis_db(redis_base_url) as db:
        migrate_sync(db_url)
        url = _redis_db_url(redis_base_url, db)
        with sync_redis.Redis.from_url(url) as client:
            client.flushdb()
        pool = AsyncConnectionPool(db_url, min_size=1, max_size=4, open=False)
        await pool.open()
        redis = Redis.from_url(url)
        environment = Env(pool, redis, await RecordedLedger(pool).setup(), OTHER_NAMESPACE)
        try:
            yield environment
        finally:
            await environment.close()
            await redis.aclose()
            await pool.close()
            with sync_redis.Redis.from_url(url) as client:
                client.flushdb()


async def test_the_same_node_id_registering_in_another_run_does_not_supersede_this_runs_node(
    env: Env, other_run: Env
) -> None:
    a = await env.orchestrator()
    mine = await env.node(a, "n1")
    b = await other_run.orchestrator()
    await other_run.node(b, "n1")  # its registration tells its run's replicas on `n1`'s channel
    # A message on this run's channel for `n1`, after the other run's: once the node sees the
    # drain, this replica has handled whatever came before on its bus.
    assert await env.store.request_drain("n1")
    await mine.wait_for(lambda: mine.drains > 0 or mine.closed.is_set())
    assert mine.close_code is None, f"closed with {mine.close_code} by the other run's registration"
    assert mine.drains == 1


async def test_a_drain_in_another_run_reaches_nobody_in_this_run(env: Env, other_run: Env) -> None:
    a = await env.orchestrator()
    mine = await env.node(a, "n1")
    assert not await other_run.store.request_drain("n1")  # no replica of its run owns an `n1`
    assert mine.drains == 0


async def test_an_orchestrator_id_in_two_runs_has_a_channel_in_each(env: Env, other_run: Env) -> None:
    a = await env.orchestrator(orchestrator_id="orch-same")
    b = await other_run.orchestrator(orchestrator_id="orch-same")
    lost = msgs.LostMsg(request_id="r1", reason="unreachable")
    assert await b.plane.routing.bus.to_replica("orch-same", lost) == 1  # itself only
    assert await a.plane.routing.bus.to_replica("orch-same", lost) == 1
