"""A real gateway in-process (PostgreSQL, Redis, node store, local JWT issuer) in front of the real
platform (`tests/fleet.py`: an orchestrator replica, a node agent, enginesim), optionally served by
uvicorn on a free loopback port. Its dispatcher is the real one, recorded (`RecordingDispatcher`)."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
import uvicorn
from psycopg_pool import AsyncConnectionPool

from apps.core.clock import SYSTEM
from apps.core.fairboard import RedisQueueBoard
from apps.core.guardrails.counts import DecisionCounts
from apps.core.guardrails.store import GuardrailStore
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
from apps.core.respcache.policies import CachePolicyStore
from apps.core.respcache.store import CacheStore
from apps.core.rollouts import RolloutStore
from apps.core.spec import load_spec
from apps.gateway.app import create_app
from apps.gateway.deps import GatewayDeps
from apps.gateway.dispatcher import HttpDispatcher
from apps.gateway.settings import GatewaySettings
from apps.gateway.wiring import StoreHealth
from tests.fakes.static_resolver import StaticResolver
from tests.fleet import REVISION, Fleet, FleetSetup, RecordingDispatcher, running_fleet

SECRET = b"test-secret-key"


@dataclass
class GatewayEnv:
    app: Any
    deps: GatewayDeps
    settings: GatewaySettings
    issuer: LocalIssuer
    admin_token: str
    dispatcher: RecordingDispatcher
    fleet: Fleet
    redis: Any
    pool: AsyncConnectionPool
    base_url: str = ""

    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"}

    async def settled(self, timeout_s: float = 20.0) -> None:
        """Until no reservation is open. The orchestrator settles a request from its node's `done`
        report, on its own settle workers: the ledger can lag the client's last byte by a moment."""
        deadline = time.monotonic() + timeout_s
        while True:
            async with self.pool.connection() as conn:
                cur = await conn.execute("SELECT count(*) FROM usage_ledger WHERE status = 'reserved'")
                row = await cur.fetchone()
            if row is not None and row[0] == 0:
                return
            assert time.monotonic() < deadline, f"{row} reservation(s) still open after {timeout_s} s"
            await asyncio.sleep(0.02)  # polled with a deadline: the ledger has no change event

    async def balance(self, team_id: int) -> int:
        """The team's balance in microcredits."""
        async with self.pool.connection() as conn:
            cur = await conn.execute("SELECT balance_microcredits FROM teams WHERE id = %s", (team_id,))
            row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    async def team_with_key(
        self, team_name: str, /, credits: int = 1_000_000_000, **key_args: Any
    ) -> tuple[int, str]:
        team = await self.deps.teams.create_team(team_name)
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
    ledger: PgLedger,
    dispatcher: RecordingDispatcher,
    resolver: StaticResolver | None,
) -> GatewayDeps:
    spec = load_spec("dev")
    return GatewayDeps(
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
        guardrail_counts=DecisionCounts(redis, SYSTEM.now),
        board=RedisQueueBoard(redis),
        guardrails=GuardrailStore(pool),
        cache_policies=CachePolicyStore(pool),
        # The fleet's nodes say they serve `REVISION` (the stack's revisions are the real weights'); the
        # stable revision is read from the rollouts at every lookup (a test changes it).
        cache_store=CacheStore(pool, SECRET, {name: REVISION for name in spec.models}, revision_ttl_s=0.0),
    )


def _redis(url: str) -> aioredis.Redis:
    return aioredis.Redis.from_pool(
        aioredis.BlockingConnectionPool.from_url(url, max_connections=100, timeout=10)
    )


@contextlib.asynccontextmanager
async def gateway_env(
    db_url: str,
    redis_url: str,
    *,
    serve: bool = False,
    fleet: FleetSetup | None = None,
    fleet_redis_url: str | None = None,
    upstream_url: str | None = None,
    resolver: StaticResolver | None = None,
    **overrides: Any,
) -> AsyncIterator[GatewayEnv]:
    """`fleet`: the platform behind the gateway (`tests/fleet.py`); `fleet_redis_url`: the orchestrator's Redis when
    it is not the gateway's (a gateway cut off from Redis); `upstream_url`: dispatch there instead of
    to the fleet's orchestrator (a scripted HTTP stand-in for transport tests); `overrides`:
    `GatewaySettings` fields."""
    settings = GatewaySettings(
        secret_key=SECRET.decode(), database_url=db_url, redis_url=redis_url, **overrides
    )
    issuer = LocalIssuer.generate()
    jwks_url = issuer.serve()
    pool = AsyncConnectionPool(db_url, min_size=1, max_size=20, open=False)
    stack = contextlib.AsyncExitStack()
    tmp_holder = tempfile.TemporaryDirectory(prefix="llmfleet-gw-")
    tmp = tmp_holder.name
    redis = _redis(redis_url)
    fleet_redis = redis if fleet_redis_url is None else _redis(fleet_redis_url)
    server: uvicorn.Server | None = None
    task: asyncio.Task[None] | None = None
    # Everything opened is closed however set-up ends: a failure before `yield` must not leave the
    # pool's tasks or the issuer's thread running (the test session would hang closing its loop).
    try:
        await pool.open()
        ledger = PgLedger(pool, {n: m.prices for n, m in load_spec("dev").models.items()})
        # The orchestrator's own node store, as in its own process (heartbeats every 0.5 s).
        plane_store = NodeStore(
            pool, fleet_redis, SECRET, channel_namespace=settings.channel_namespace, heartbeat_interval_s=0.5
        )
        built: list[GatewayDeps] = []  # the settle's clock is the gateway's (`deps.clock`), once built
        running = await stack.enter_async_context(
            running_fleet(
                fleet_redis,
                plane_store,
                ledger,
                SECRET.decode(),
                settings.channel_namespace,
                Path(tmp),
                fleet or FleetSetup(),
                clock=lambda: built[0].clock() if built else SYSTEM.now(),
                rollouts=RolloutStore(pool) if fleet is not None and fleet.revisions else None,
            )
        )
        dispatcher = RecordingDispatcher(
            HttpDispatcher([upstream_url or running.url], running.internal_token)
        )
        stack.push_async_callback(dispatcher.aclose)
        deps = _deps(settings, pool, redis, issuer, jwks_url, ledger, dispatcher, resolver)
        built.append(deps)
        app = create_app(settings, deps)
        admin = issuer.mint("ops", admin=True)
        env = GatewayEnv(app, deps, settings, issuer, admin, dispatcher, running, redis, pool)
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
        try:
            await stack.aclose()  # the dispatcher, then the fleet (agent, engine, orchestrator)
        finally:
            await redis.aclose()
            if fleet_redis is not redis:
                await fleet_redis.aclose()
            await pool.close()
            issuer.stop()
            tmp_holder.cleanup()
