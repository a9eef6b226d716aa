"""`GuardrailStore`, the PostgreSQL `GuardrailPolicies` (`apps.core.guardrails.api`): each team's guardrail
policy in `guardrail_policies` (migration 0016), written by the admin API, read by every gateway replica
for every request.

The request path reads `compiled(team_id)`: the policy with its patterns compiled, from a per-process
cache whose entries live `cache_ttl_s` (default 4 s, as the key cache): a change saved on any replica
applies everywhere within 5 s, at once on the replica that saved it. Concurrent misses for one team
share one query. Only the policy is stored; no content ever is.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from psycopg_pool import AsyncConnectionPool

from apps.core.errors import InvalidRequest, Unavailable
from apps.core.guardrails.policy import CompiledPolicy, GuardrailPolicy, compile_policy, parse_policy
from apps.core.teamdocs import CachedTeamDocuments


def _stored(team_id: int, document: object) -> GuardrailPolicy:
    """A stored document, validated again (the rules may have tightened since it was saved)."""
    try:
        return parse_policy(document)
    except InvalidRequest as exc:
        raise Unavailable(
            f"The guardrail policy of team {team_id} no longer validates ({exc.message}); an admin must save it again.",
            code="guardrail_policy_invalid",
        ) from None


class GuardrailStore(CachedTeamDocuments[GuardrailPolicy, CompiledPolicy]):
    def __init__(
        self,
        pool: AsyncConnectionPool,
        *,
        cache_ttl_s: float = 4.0,
        max_entries: int = 10_000,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            pool,
            "guardrail_policies",
            _stored,
            compile_policy,
            ttl_s=cache_ttl_s,
            max_entries=max_entries,
            monotonic=monotonic,
        )

    async def compiled(self, team_id: int) -> CompiledPolicy | None:
        """The team's policy, compiled, for the request path (None: no guardrails), cached."""
        return await self.cached(team_id)
