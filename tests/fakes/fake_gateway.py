"""Builds a real gateway (real PostgreSQL, Redis, node store, local JWT issuer) around a fake dispatcher,
in-process, and optionally serves it with uvicorn on a free loopback port."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
import uvicorn
from psycopg_pool import AsyncConnectionPool

from apps.core.clock import SYSTEM
from apps.core.fairboard import RedisQueueBoard
from apps.core.identity.console_sessions import ConsoleSessions
from apps.core.identity.jwt_verify import JwtVerifier
from apps.core.identity.keys import KeyStore
from apps.core.identity.local_issuer import LocalIssuer
from apps.core.ledger.pg import PgLedger
from apps.core.ledger.rollups import UsageRollups
from apps.core.ledger.teams import TeamStore
from apps.core.nodes.store import NodeStore
from apps.core.quota.admission import QuotaStore
from apps.core.quota.refusals import RefusalStore
from apps.core.spec import load_spec
from apps.gateway.app import create_app
from apps.gateway.deps import GatewayDeps
from apps.gateway.settings import GatewaySettings
from apps.gateway.wiring import StoreHealth
from tests.fakes.fake_dispatcher import FakeDispatcher

SECRET = b"test-secret-key"


class StaticResolver:
    def __init__(self, table: dict[str, list[str]] | None = None) -> None:
        self.table = table or {}

    async def resolve(self, host: str) -> list[str]:
        if host not in self.table:
            raise OSError(f"cannot resolve {host}")
        return self.table[host]


@dataclass
class GatewayEnv:
    app: Any
    deps: GatewayDeps
    settings: GatewaySettings
    issuer: LocalIssuer
    admin_token: str
    dispatcher: FakeDispatcher
    redis: Any
    pool: AsyncConnectionPool
    base_url: str = ""

    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"}

    async def team_with_key(
        self, name: str, credits: int = 1_000_000_000, **key_args: Any
    ) -> tuple[int, str]:
        team = await self.deps.teams.create_team(name)
        if credits:
            await self.deps.teams.add_credits(team.id, credits)
        secret, _ = await self.deps.keys.create(team=team.id, **key_args)
        return team.id, secret


def _deps(
    settings: GatewaySettings,
    pool: AsyncConnectionPool,
    redis: aioredis.Redis,
    issuer: LocalIssuer,
    jwks_url: str,
    dispatcher_factory: Callable[[PgLedger, Any], FakeDispatcher] | None,
    resolver: StaticResolver | None,
) -> tuple[GatewayDeps, FakeDispatcher]:
    spec = load_spec("dev")
    ledger = PgLedger(pool, {n: m.prices for n, m in spec.models.items()})
    dispatcher = (dispatcher_factory or (lambda lg, rd: FakeDispatcher(lg, rd)))(ledger, redis)
    deps = GatewayDeps(
        spec=spec,
        ledger=ledger,
        teams=TeamStore(pool),
        keys=KeyStore(pool, SECRET, cache_ttl_s=settings.key_cache_ttl_s),
        quota=QuotaStore(redis, lease_s=settings.stream_lease_s),
        dispatcher=dispatcher,
        nodes=NodeStore(pool, redis, SECRET, channel_namespace=settings.channel_namespace),
        health=StoreHealth(pool, redis),
        resolver=resolver or StaticResolver(),
        jwt=JwtVerifier(jwks_url, issuer=issuer.issuer, audience=issuer.audience),
        usage=UsageRollups(pool),
        sessions=ConsoleSessions(pool),
        refusals=RefusalStore(redis, SYSTEM.now),
        board=RedisQueueBoard(redis),
    )
    return deps, dispatcher


@contextlib.asynccontextmanager
async def gateway_env(
    db_url: str,
    redis_url: str,
    *,
    serve: bool = False,
    dispatcher_factory: Callable[[PgLedger, Any], FakeDispatcher] | None = None,
    resolver: StaticResolver | None = None,
    **overrides: Any,
) -> AsyncIterator[GatewayEnv]:
    settings = GatewaySettings(
        secret_key=SECRET.decode(), database_url=db_url, redis_url=redis_url, **overrides
    )
    issuer = LocalIssuer.generate()
    jwks_url = issuer.serve()
    pool = AsyncConnectionPool(db_url, min_size=1, max_size=20, open=False)
    redis = aioredis.Redis.from_pool(
        aioredis.BlockingConnectionPool.from_url(redis_url, max_connections=100, timeout=10)
    )
    server: uvicorn.Server | None = None
    task: asyncio.Task[None] | None = None
    # Everything opened is closed however set-up ends: a failure before `yield` must not leave the
    # pool's tasks or the issuer's thread running (the test session would hang closing its loop).
    try:
        await pool.open()
        deps, dispatcher = _deps(settings, pool, redis, issuer, jwks_url, dispatcher_factory, resolver)
        app = create_app(settings, deps)
        env = GatewayEnv(app, deps, settings, issuer, issuer.mint("ops", admin=True), dispatcher, redis, pool)
        if serve:
            config = uvicorn.Config(
                app, host="127.0.0.1", port=0, log_config=None, access_log=False, lifespan="off"
            )
            server = uvicorn.Server(config)
            task = asyncio.create_task(server.serve())
            deadline = time.monotonic() + 10
            while not server.started:
                assert time.monotonic() < deadline, "uvicorn did not start"
                assert not task.done(), "uvicorn exited"
                await asyncio.sleep(0.01)
            port = server.servers[0].sockets[0].getsockname()[1]
            env.base_url = f"http://127.0.0.1:{port}"
        yield env
    finally:
        if server is not None and task is not None:
            server.should_exit = True
            await task
        await redis.aclose()
        await pool.close()
        issuer.stop()
