"""The prefix announcements in Redis (apps/orchestrator/prefix_store.py): what every replica's
picker reads, retracted when the block goes, forgotten with the node."""

from __future__ import annotations

import uuid

import pytest
from redis.asyncio import Redis

from apps.orchestrator.prefix_store import PrefixStore

pytestmark = pytest.mark.timeout(30)


async def test_announce_retract_forget_and_the_longest_match(redis_url: str) -> None:
    redis = Redis.from_url(redis_url)
    store = PrefixStore(redis, ttl_s=60)
    a, b = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    try:
        await store.announce(a, "m", "k-long", 12)
        await store.announce(a, "m", "k-short", 3)
        await store.announce(b, "m", "k-short", 3)
        await store.announce(b, "other", "k-long", 40)
        assert await store.matches("m", ["k-long", "k-short"]) == {a: 12, b: 3}  # longest first wins
        assert await store.matches("m", []) == {}
        await store.retract(a, "m", ["k-long"])
        assert await store.matches("m", ["k-long", "k-short"]) == {a: 3, b: 3}
        await store.forget(b, "m")  # b's index of m reset: its other model stays
        assert await store.matches("m", ["k-long", "k-short"]) == {a: 3}
        assert await store.matches("other", ["k-long"]) == {b: 40}
        await store.forget(a)
        assert await store.matches("m", ["k-long", "k-short"]) == {}
        # An entry of a socket the node no longer has (its replica killed before retracting) is not
        # believed once the node registered again on another socket.
        await store.announce(a, "m", "k-long", 12, conn="socket-1")
        assert await store.matches("m", ["k-long"], {a: "socket-1"}) == {a: 12}
        assert await store.matches("m", ["k-long"], {a: "socket-2"}) == {}
        assert await store.matches("m", ["k-long"], {}) == {}  # not in the fleet at all
        assert await redis.ttl("pfx:other:k-long") > 0  # entries expire even if never retracted
    finally:
        await redis.aclose()
