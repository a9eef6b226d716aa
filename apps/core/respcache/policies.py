"""`CachePolicyStore`: each team's response cache policy in `response_cache_policies` (migration 0017,
`apps.core.teamdocs`), written by the admin API, read by every gateway replica for every chat and completion
request through a 4-second per-process cache (`apps.core.ttlcache`): a change saved on any replica applies
everywhere within 5 s, at once on the replica that saved it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from psycopg_pool import AsyncConnectionPool

from apps.core.errors import Unavailable
from apps.core.respcache.policy import CachePolicy
from apps.core.teamdocs import StoredDocument, TeamDocuments
from apps.core.ttlcache import TtlCache

StoredCachePolicy = StoredDocument[CachePolicy]


def _stored(team_id: int, document: object) -> CachePolicy:
    try:
        return CachePolicy.model_validate(document)
    except ValueError:
        raise Unavailable(
            f"The response cache policy of team {team_id} no longer validates; an admin must save it again.",
            code="cache_policy_invalid",
        ) from None


class CachePolicyStore:
    def __init__(
        self,
        pool: AsyncConnectionPool,
        *,
        cache_ttl_s: float = 4.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._docs: TeamDocuments[CachePolicy] = TeamDocuments(pool, "response_cache_policies", _stored)
        self._cache: TtlCache[int, CachePolicy | None] = TtlCache(
            self._docs.load, ttl_s=cache_ttl_s, monotonic=monotonic
        )

    async def get(self, team_id: int) -> StoredCachePolicy | None:
        """The team's policy (None: the cache is off); `NotFound` for a team that does not exist."""
        return await self._docs.get(team_id)

    async def put(self, team_id: int, policy: CachePolicy) -> StoredCachePolicy:
        try:
            return await self._docs.put(team_id, policy)
        finally:
            self._cache.forget(team_id)

    async def delete(self, team_id: int) -> bool:
        """Turn the team's cache off (its entries stay sealed until purged or expired, never served)."""
        try:
            return await self._docs.delete(team_id)
        finally:
            self._cache.forget(team_id)

    async def policy(self, team_id: int) -> CachePolicy | None:
        """The request path's read (None: the cache is off for the team), cached."""
        return await self._cache.get(team_id)
