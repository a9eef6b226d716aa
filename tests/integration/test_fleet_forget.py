"""A node forgotten (its socket torn down, its hash removed) while a fleet refresh is reading must
not be put back by that refresh: its reads may predate the removal, and the dead node would stay in
the view until the next refresh (a chaos-free test saw `fleet.get(node)` still answer after the
teardown: `test_dead_node_link.py`). Real Redis; the refresh is held between its reads and its
update of the view by a pipeline that waits for the test.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from redis.asyncio import Redis

from apps.orchestrator.fleet import Fleet

pytestmark = pytest.mark.timeout(30)


class HeldRedis:
    """The real client, whose pipelines' `execute` waits for `release` once `held` is set."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self.held = False
        self.reading = asyncio.Event()
        self.release = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._redis, name)

    def pipeline(self, **kw: Any) -> Any:
        pipe = self._redis.pipeline(**kw)
        if not self.held:
            return pipe
        execute = pipe.execute

        async def held_execute(*args: Any, **kwargs: Any) -> Any:
            answers = await execute(*args, **kwargs)  # read before the removal below
            self.reading.set()
            await self.release.wait()
            return answers

        pipe.execute = held_execute  # type: ignore[method-assign]
        return pipe


async def test_a_refresh_in_progress_does_not_bring_back_a_node_forgotten_meanwhile(redis_url: str) -> None:
    redis = Redis.from_url(redis_url)
    held = HeldRedis(redis)
    fleet = Fleet(held, heartbeat_interval_s=1, heartbeat_ttl_s=3, missed_heartbeats=3, max_request_s=60)  # type: ignore[arg-type]
    node, conn = f"n-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    try:
        fields = {"conn": conn, "models": '{"m": 4}', "location": "cloud", "gpus": 1}
        await fleet.write_heartbeat(node, conn, fields, register=True)
        assert node in await fleet.refresh()

        held.held = True
        refresh = asyncio.create_task(fleet.refresh())
        await asyncio.wait_for(held.reading.wait(), 10)  # it has read the node's hash
        assert await fleet.remove(node, conn)  # the teardown: hash removed, then forgotten
        fleet.forget(node)
        held.release.set()
        assert node not in await refresh  # before: the stale read put the dead node back
        assert fleet.get(node) is None

        held.held = False
        assert node not in await fleet.refresh()
        assert fleet._forgotten == {}  # nothing kept once no refresh that predates it runs
    finally:
        await redis.aclose()
