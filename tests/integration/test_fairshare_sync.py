"""`TeamService.sync` against real Redis: counters of two replicas add up, each replica sees the
other's interactive waiters (not its own, not a stale replica's), a failed sync loses nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from apps.core.sharing import PriorityClass
from apps.orchestrator.fairshare import TeamService

INTERACTIVE, BATCH = PriorityClass.INTERACTIVE, PriorityClass.BATCH


@pytest.fixture
async def rds(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    c = aioredis.Redis.from_url(redis_url)
    yield c
    await c.aclose()


async def test_two_replicas_share_counters_and_waiters(rds: aioredis.Redis) -> None:
    now = [1000.0]
    r1, r2 = TeamService("r1", lambda: now[0]), TeamService("r2", lambda: now[0])
    r1.charge("m", 7, 300)
    r2.charge("m", 7, 200)
    r2.charge("m", 8, 50)
    await r1.sync(rds, ["m"], {"m": {(INTERACTIVE, 7): (4, 1.5), (BATCH, 8): (9, 3.0)}})
    await r2.sync(rds, ["m"], {"m": {(BATCH, 8): (2, 0.5)}})
    assert r2.served("m", 7) == 500
    assert r2.served("m", 8) == 50
    assert r2.interactive_elsewhere("m")  # r1's four interactive waiters
    await r1.sync(rds, ["m"], {"m": {}})
    assert r1.served("m", 7) == 500
    assert not r1.interactive_elsewhere("m")  # r2 has only batch waiting; its own do not count
    # A replica that stopped syncing is ignored once its entry is stale.
    await r1.sync(rds, ["m"], {"m": {(INTERACTIVE, 7): (1, 0.1)}})
    now[0] += 60
    await r2.sync(rds, ["m"], {"m": {}})
    assert not r2.interactive_elsewhere("m")


async def test_a_failed_sync_keeps_the_charges_for_the_next(rds: aioredis.Redis, redis_url: str) -> None:
    svc = TeamService("r1")
    svc.charge("m", 1, 120)
    broken = aioredis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    with pytest.raises(RedisConnectionError):
        await svc.sync(broken, ["m"], {})
    await broken.aclose()
    assert svc.served("m", 1) == 120
    await svc.sync(rds, ["m"], {})
    assert svc.served("m", 1) == 120
    assert float(await rds.hget("fair:svc:m", "1") or 0) == 120
