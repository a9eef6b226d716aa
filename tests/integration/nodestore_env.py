"""A `NodeStore` on a migrated database and real Redis, for the node-store tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from apps.core.nodes.store import NodeStore
from tests.ids import CHANNEL_NAMESPACE

SECRET = b"k" * 32

Store = tuple[NodeStore, AsyncConnectionPool, Redis]


@contextlib.asynccontextmanager
async def node_store(db_url: str, redis_url: str) -> AsyncIterator[Store]:
    pool = AsyncConnectionPool(db_url, min_size=1, max_size=4, open=False)
    await pool.open()
    redis = Redis.from_url(redis_url)
    try:
        yield (
            NodeStore(pool, redis, SECRET, channel_namespace=CHANNEL_NAMESPACE, heartbeat_interval_s=5.0),
            pool,
            redis,
        )
    finally:
        await redis.aclose()
        await pool.close()
