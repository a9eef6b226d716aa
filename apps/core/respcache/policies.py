"""`CachePolicyStore`: each team's response cache policy in `response_cache_policies` (migration 0017),
written by the admin API, read by every gateway replica for every chat and completion request through a
4-second per-process cache (`apps.core.ttlcache`): a change saved on any replica applies everywhere
within 5 s, at once on the replica that saved it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg.errors
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from apps.core.errors import NotFound, Unavailable
from apps.core.respcache.policy import CachePolicy
from apps.core.stores import postgres_boundary
from apps.core.ttlcache import TtlCache


def team_not_found(team_id: int) -> NotFound:
    return NotFound(f"team {team_id} does not exist", param="team_id", code="team_not_found")


def _stored(team_id: int, document: Any) -> CachePolicy:
    try:
        return CachePolicy.model_validate(document)
    except ValueError:
        raise Unavailable(
            f"The response cache policy of team {team_id} no longer validates; an admin must save it again.",
            code="cache_policy_invalid",
        ) from None


@dataclass(frozen=True)
class StoredCachePolicy:
    team_id: int
    policy: CachePolicy
    updated_at: datetime

    def as_json(self) -> dict[str, Any]:
        return {
            "team_id": self.team_id,
            "policy": self.policy.as_json(),
            "updated_at": self.updated_at.isoformat(),
        }


class CachePolicyStore:
    def __init__(
        self,
        pool: AsyncConnectionPool,
        *,
        cache_ttl_s: float = 4.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pool = pool
        self._cache: TtlCache[int, CachePolicy | None] = TtlCache(
            self._load, ttl_s=cache_ttl_s, monotonic=monotonic
        )

    @postgres_boundary()
    async def get(self, team_id: int) -> StoredCachePolicy | None:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT p.policy, p.updated_at FROM teams t LEFT JOIN response_cache_policies p"
                " ON p.team_id = t.id WHERE t.id = %s",
                (team_id,),
            )
            row = await cur.fetchone()
        if row is None:
            raise team_not_found(team_id)
        return None if row[0] is None else StoredCachePolicy(team_id, _stored(team_id, row[0]), row[1])

    @postgres_boundary()
    async def put(self, team_id: int, policy: CachePolicy) -> StoredCachePolicy:
        try:
            async with self._pool.connection() as conn:
                cur = await conn.execute(
                    "INSERT INTO response_cache_policies (team_id, policy) SELECT id, %s FROM teams WHERE id = %s"
                    " ON CONFLICT (team_id) DO UPDATE SET policy = EXCLUDED.policy, updated_at = now()"
                    " RETURNING updated_at",
                    (Jsonb(policy.as_json()), team_id),
                )
                row = await cur.fetchone()
        except psycopg.errors.ForeignKeyViolation:
            row = None
        self._cache.forget(team_id)
        if row is None:
            raise team_not_found(team_id)
        return StoredCachePolicy(team_id, policy, row[0])

    @postgres_boundary()
    async def delete(self, team_id: int) -> bool:
        """Turn the team's cache off (its entries stay until purged or expired, never served)."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "WITH team AS (SELECT id FROM teams WHERE id = %s),"
                " gone AS (DELETE FROM response_cache_policies p USING team WHERE p.team_id = team.id RETURNING 1)"
                " SELECT (SELECT count(*) FROM team), (SELECT count(*) FROM gone)",
                (team_id,),
            )
            row = await cur.fetchone()
        self._cache.forget(team_id)
        if row is None or row[0] == 0:
            raise team_not_found(team_id)
        return bool(row[1])

    async def policy(self, team_id: int) -> CachePolicy | None:
        """The request path's read (None: the cache is off for the team), cached."""
        return await self._cache.get(team_id)

    @postgres_boundary()
    async def _load(self, team_id: int) -> CachePolicy | None:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT policy FROM response_cache_policies WHERE team_id = %s", (team_id,)
            )
            row = await cur.fetchone()
        return None if row is None else _stored(team_id, row[0])
