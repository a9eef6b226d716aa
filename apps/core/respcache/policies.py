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
from apps.core.teamdocs import CachedTeamDocuments, StoredDocument

StoredCachePolicy = StoredDocument[CachePolicy]


def _stored(team_id: int, document: object) -> CachePolicy:
    try:
        return CachePolicy.model_validate(document)
    except ValueError:
        raise Unavailable(
            f"The response cache policy of team {team_id} no longer validates; an admin must save it again.",
            code="cache_policy_invalid",
        ) from None


class CachePolicyStore(CachedTeamDocuments[CachePolicy, CachePolicy]):
    def __init__(
        self,
        pool: AsyncConnectionPool,
        *,
        cache_ttl_s: float = 4.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            pool,
            "response_cache_policies",
            _stored,
            lambda policy: policy,
            ttl_s=cache_ttl_s,
            monotonic=monotonic,
        )

    async def policy(self, team_id: int) -> CachePolicy | None:
        """The request path's read (None: the cache is off for the team), cached. `delete` turns the cache
        off; the team's entries stay sealed until they are purged or expire, never served."""
        return await self.cached(team_id)
