"""For the stores that count per UTC day in Redis (refusals, guardrail decisions): a client on the test's
own Redis DB (`redis_url`, flushed before and after) as a fixture, and a clock the test moves."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime

import pytest
import redis.asyncio as aioredis


class SetClock:
    """`now` until the test sets another."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()
