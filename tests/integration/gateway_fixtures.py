"""The in-process gateway (real PostgreSQL and Redis, the real platform behind it: `tests/fleet.py`) as a
fixture, and its client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from tests.gateway_env import GatewayEnv, gateway_env


@pytest.fixture
async def gateway(migrated_db_url: str, redis_url: str) -> AsyncIterator[GatewayEnv]:
    # Counting a refusal for the console is bounded (0.25 s by default) and skipped past it: a
    # pause of the loaded test machine must not drop the count a console test then looks for.
    async with gateway_env(migrated_db_url, redis_url, refusal_count_timeout_s=5.0) as e:
        yield e


def client(env: GatewayEnv) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=env.app), base_url="http://gw")
