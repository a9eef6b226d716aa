"""Refusal counts per team and UTC day in real Redis (`apps.core.quota.refusals.RefusalStore`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import redis.asyncio as aioredis

from apps.core.errors import StoreUnavailable
from apps.core.quota.refusals import KEEP_DAYS, RefusalCount, RefusalStore, refusals_key
from tests.integration.redis_client import SetClock, redis

__all__ = ["redis"]  # the fixture, imported for pytest

DAY = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


async def test_counts_by_status_reason_and_key_over_today_and_the_week(redis: aioredis.Redis) -> None:
    clock = SetClock(DAY)
    store = RefusalStore(redis, clock)
    clock.now = DAY - timedelta(days=3)
    await store.count(7, 1, 429, "rpm")
    clock.now = DAY - timedelta(days=8)  # outside the 7-day window
    await store.count(7, 1, 429, "rpm")
    clock.now = DAY
    for _ in range(2):
        await store.count(7, 1, 429, "rpm")
    await store.count(7, 2, 503, "queue_full")
    await store.count(7, None, 429, "max_streams")  # a JWT caller
    await store.count(8, 1, 429, "rpm")  # another team
    assert await store.recent(7) == [
        RefusalCount(429, "max_streams", 1, 1),
        RefusalCount(429, "rpm", 2, 3),
        RefusalCount(503, "queue_full", 1, 1),
    ]
    assert await store.recent(7, key_id=2) == [RefusalCount(503, "queue_full", 1, 1)]
    assert await store.recent(9) == []
    ttl = await redis.ttl(refusals_key(7, DAY.date()))
    assert KEEP_DAYS * 86_400 - 5 <= ttl <= KEEP_DAYS * 86_400


async def test_a_reason_with_a_colon_cannot_break_the_field_format(redis: aioredis.Redis) -> None:
    store = RefusalStore(redis, SetClock(DAY))
    await store.count(7, 3, 503, "odd:reason")
    assert await store.recent(7, key_id=3) == [RefusalCount(503, "odd_reason", 1, 1)]


async def test_redis_down_is_store_unavailable() -> None:
    client = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    try:
        store = RefusalStore(client, SetClock(DAY))
        with pytest.raises(StoreUnavailable):
            await store.count(7, 1, 429, "rpm")
        with pytest.raises(StoreUnavailable):
            await store.recent(7)
    finally:
        await client.aclose()
