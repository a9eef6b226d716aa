"""`apps.core.ttlcache.TtlCache`: the request path's per-process cache of team settings."""

from __future__ import annotations

import asyncio

import pytest

from apps.core.ttlcache import TtlCache

pytestmark = pytest.mark.timeout(10)


class Source:
    def __init__(self) -> None:
        self.loads = 0
        self.value = "v1"
        self.gate = asyncio.Event()
        self.gate.set()

    async def load(self, key: int) -> str:
        self.loads += 1
        await self.gate.wait()
        return f"{key}:{self.value}"


async def test_concurrent_misses_share_one_load_and_entries_live_their_ttl() -> None:
    now = [0.0]
    source = Source()
    cache: TtlCache[int, str] = TtlCache(source.load, ttl_s=4.0, monotonic=lambda: now[0])
    source.gate.clear()
    waiters = [asyncio.ensure_future(cache.get(1)) for _ in range(5)]
    await asyncio.sleep(0)  # let each waiter reach the load (no timing: one loop turn)
    source.gate.set()
    assert await asyncio.gather(*waiters) == ["1:v1"] * 5
    assert source.loads == 1
    source.value = "v2"
    now[0] = 3.9
    assert await cache.get(1) == "1:v1"
    now[0] = 4.1
    assert await cache.get(1) == "1:v2"
    assert source.loads == 2


async def test_a_write_during_a_load_keeps_the_old_value_out_of_the_cache() -> None:
    source = Source()
    cache: TtlCache[int, str] = TtlCache(source.load, ttl_s=60.0)
    source.gate.clear()
    loading = asyncio.ensure_future(cache.get(1))
    await asyncio.sleep(0)
    cache.forget(1)  # an admin saved a new value on this process meanwhile
    source.gate.set()
    assert await loading == "1:v1"
    source.value = "v2"
    assert await cache.get(1) == "1:v2"  # the load that predated the write was not cached


async def test_a_cancelled_waiter_does_not_cancel_the_load_and_the_size_is_bounded() -> None:
    source = Source()
    cache: TtlCache[int, str] = TtlCache(source.load, ttl_s=60.0, max_entries=2)
    source.gate.clear()
    first = asyncio.ensure_future(cache.get(1))
    second = asyncio.ensure_future(cache.get(1))
    await asyncio.sleep(0)
    first.cancel()
    source.gate.set()
    assert await second == "1:v1"
    for key in (2, 3):
        await cache.get(key)
    loads = source.loads
    await cache.get(1)  # the oldest fill was dropped for the third key
    assert source.loads == loads + 1
