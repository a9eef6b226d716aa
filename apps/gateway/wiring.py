"""`build_deps(settings)`: the real dependencies (PostgreSQL pool, Redis, JWKS, orchestrator client)."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
from psycopg_pool import AsyncConnectionPool

from apps.core.clock import SYSTEM
from apps.core.envnames import env_name
from apps.core.fairboard import RedisQueueBoard
from apps.core.guardrails.counts import DecisionCounts
from apps.core.guardrails.store import GuardrailStore
from apps.core.identity.console_sessions import ConsoleSessions
from apps.core.identity.jwt_verify import JwtVerifier
from apps.core.identity.keys import KeyStore
from apps.core.ledger.pg import PgLedger
from apps.core.ledger.rollups import UsageRollups
from apps.core.ledger.teams import TeamStore
from apps.core.nodes.store import NodeStore
from apps.core.quota.admission import QuotaStore
from apps.core.quota.refusals import RefusalStore
from apps.core.respcache.policies import CachePolicyStore
from apps.core.respcache.store import CacheStore
from apps.core.spec import load_spec
from apps.gateway.deps import GatewayDeps
from apps.gateway.dispatcher import HttpDispatcher
from apps.gateway.ports import NodeAdmin
from apps.gateway.settings import GatewaySettings
from apps.gateway.slo import PrometheusSlo
from apps.gateway.validate import SystemResolver


class StoreHealth:
    def __init__(self, pool: AsyncConnectionPool, redis: Any) -> None:
        self._pool = pool
        self._redis = redis

    async def postgres_ok(self) -> bool:
        try:
            async with asyncio.timeout(2):
                async with self._pool.connection() as conn:
                    await conn.execute("SELECT 1")
        except Exception:  # any failure means not ready
            return False
        return True

    async def redis_ok(self) -> bool:
        try:
            async with asyncio.timeout(2):
                return bool(await self._redis.ping())
        except Exception:  # any failure means not ready
            return False


def node_admin(pool: AsyncConnectionPool, redis: Any, secret_key: bytes, channel_namespace: str) -> NodeAdmin:
    return NodeStore(pool, redis, secret_key, channel_namespace=channel_namespace)


async def pg_pools(settings: GatewaySettings) -> tuple[AsyncConnectionPool, AsyncConnectionPool]:
    """(the stores' pool, the node admin's pool), both opening in the background."""
    # Autocommit: every statement the gateway's stores run outside an explicit `transaction()` is a
    # single statement (the reservation is one CTE), so the implicit transaction only cost a second
    # round trip (COMMIT) per request and held the team's row lock across it; multi-statement
    # writes (credits) use `conn.transaction()` and stay atomic.
    pool = AsyncConnectionPool(
        settings.database_url,
        min_size=settings.pg_pool_min,
        max_size=settings.pg_pool_max,
        kwargs={"autocommit": True},
        open=False,
        timeout=5,
    )
    await pool.open(wait=False)
    node_pool = AsyncConnectionPool(
        settings.database_url, min_size=0, max_size=settings.pg_nodes_pool_max, open=False, timeout=5
    )
    await node_pool.open(wait=False)
    return pool, node_pool


def redis_client(settings: GatewaySettings) -> Any:
    # A blocking pool: under a burst, callers wait (bounded) for a connection instead of failing.
    return aioredis.Redis.from_pool(
        aioredis.BlockingConnectionPool.from_url(
            settings.redis_url,
            max_connections=settings.redis_max_connections,
            timeout=2,
            socket_timeout=2,
            socket_connect_timeout=2,
        )
    )


def jwt_verifier(settings: GatewaySettings) -> JwtVerifier:
    return JwtVerifier(
        settings.jwks_url,
        issuer=settings.jwt_issuer,
        audience=settings.jwt_audience,
        algorithms=[a.strip() for a in settings.jwt_algorithms.split(",") if a.strip()],
        team_claim=settings.jwt_team_claim,
        team_id_claim=settings.jwt_team_id_claim,
        class_claim=settings.jwt_class_claim,
        models_claim=settings.jwt_models_claim,
        admin_claim=settings.jwt_admin_claim,
        admin_role=settings.jwt_admin_role,
        cache_s=settings.jwt_cache_s,
    )


async def build_deps(settings: GatewaySettings) -> GatewayDeps:
    if not settings.secret_key:
        raise ValueError(f"{env_name(GatewaySettings, 'secret_key')} is required")
    spec = load_spec(settings.stack)
    secret = settings.secret_key.encode()
    pool, node_pool = await pg_pools(settings)
    redis = redis_client(settings)
    jwt = jwt_verifier(settings) if settings.jwks_url else None
    dispatcher = HttpDispatcher(
        [u.strip() for u in settings.orchestrator_url.split(",") if u.strip()], settings.internal_token
    )

    async def close_redis() -> None:
        await redis.aclose()

    slo = (
        PrometheusSlo(settings.prometheus_url, spec, settings.prometheus_timeout_s)
        if settings.prometheus_url
        else None
    )

    return GatewayDeps(
        spec=spec,
        ledger=PgLedger(pool, {name: m.prices for name, m in spec.models.items()}),
        teams=TeamStore(pool),
        keys=KeyStore(pool, secret, cache_ttl_s=settings.key_cache_ttl_s),
        quota=QuotaStore(redis, lease_s=settings.stream_lease_s),
        dispatcher=dispatcher,
        nodes=node_admin(node_pool, redis, secret, settings.channel_namespace),
        health=StoreHealth(pool, redis),
        resolver=SystemResolver(),
        jwt=jwt,
        usage=UsageRollups(pool),
        sessions=ConsoleSessions(pool),
        refusals=RefusalStore(redis, SYSTEM.now),
        guardrail_counts=DecisionCounts(redis, SYSTEM.now),
        slo=slo,
        board=RedisQueueBoard(redis),
        guardrails=GuardrailStore(pool),
        cache_policies=CachePolicyStore(pool),
        cache_store=CacheStore(pool, secret, {name: m.revision for name, m in spec.models.items()}),
        closers=[dispatcher.aclose, close_redis, pool.close, node_pool.close, *([slo.aclose] if slo else [])],
    )
