"""`TtlCache`: a per-process cache of values loaded by key from a store (PostgreSQL), for the request
path: entries live `ttl_s`, at most `max_entries` (least recently filled first out), concurrent misses
of one key share one load (single flight; a waiter that is cancelled does not cancel the load), and a
write on this process (`forget`) drops the key and keeps a load that began before it from filling the
cache with what may predate the write. Used by the team guardrail policies and the response cache.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    def __init__(
        self,
        load: Callable[[K], Awaitable[V]],
        *,
        ttl_s: float,
        max_entries: int = 10_000,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._load = load
        self._ttl = ttl_s
        self._max = max_entries
        self._mono = monotonic
        self._cache: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._loading: dict[K, asyncio.Future[V]] = {}
        self._writes = 0

    async def get(self, key: K) -> V:
        hit = self._cache.get(key)
        if hit is not None and hit[0] > self._mono():
            return hit[1]
        return await asyncio.shield(self._lookup(key))

    def forget(self, key: K) -> None:
        self._writes += 1
        self._cache.pop(key, None)
        self._loading.pop(key, None)

    def _lookup(self, key: K) -> asyncio.Future[V]:
        running = self._loading.get(key)
        if running is not None and not running.done():
            return running
        started, writes = self._mono(), self._writes

        async def load() -> V:
            value = await self._load(key)
            if writes != self._writes:
                return value  # a write on this process since: do not cache what may predate it
            self._cache[key] = (started + self._ttl, value)
            self._cache.move_to_end(key)
            while len(self._cache) > self._max:
                self._cache.popitem(last=False)
            return value

        task = asyncio.ensure_future(load())
        self._loading[key] = task

        def finished(done: asyncio.Future[V]) -> None:
            if self._loading.get(key) is done:
                del self._loading[key]
            if not done.cancelled():
                done.exception()  # retrieved: each waiter raises it

        task.add_done_callback(finished)
        return task
