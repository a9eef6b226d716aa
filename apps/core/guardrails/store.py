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

import psycopg.errors
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from apps.core.errors import InvalidRequest, NotFound, Unavailable
from apps.core.guardrails.api import StoredPolicy
from apps.core.guardrails.policy import CompiledPolicy, GuardrailPolicy, compile_policy, parse_policy
from apps.core.stores import postgres_boundary
from apps.core.ttlcache import TtlCache


def _team_not_found(team_id: int) -> NotFound:
    return NotFound(f"team {team_id} does not exist", param="team_id", code="team_not_found")


def _stored(team_id: int, document: object) -> GuardrailPolicy:
    """A stored document, validated again (the rules may have tightened since it was saved)."""
    try:
        return parse_policy(document)
    except InvalidRequest as exc:
        raise Unavailable(
            f"The guardrail policy of team {team_id} no longer validates ({exc.message}); an admin must save it again.",
            code="guardrail_policy_invalid",
        ) from None


class GuardrailStore:
    def __init__(
        self,
        pool: AsyncConnectionPool,
        *,
        cache_ttl_s: float = 4.0,
        max_entries: int = 10_000,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pool = pool
        self._cache: TtlCache[int, CompiledPolicy | None] = TtlCache(
            self._load, ttl_s=cache_ttl_s, max_entries=max_entries, monotonic=monotonic
        )
        self.db_lookups = 0

    @postgres_boundary()
    async def get(self, team_id: int) -> StoredPolicy | None:
        """The team's policy (None: it has none); `NotFound` for a team that does not exist."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT g.policy, g.updated_at FROM teams t LEFT JOIN guardrail_policies g ON g.team_id = t.id"
                " WHERE t.id = %s",
                (team_id,),
            )
            row = await cur.fetchone()
        if row is None:
            raise _team_not_found(team_id)
        return None if row[0] is None else StoredPolicy(team_id, _stored(team_id, row[0]), row[1])

    @postgres_boundary()
    async def put(self, team_id: int, policy: GuardrailPolicy) -> StoredPolicy:
        """Save (replace) the team's policy; `NotFound` for a team that does not exist."""
        try:
            async with self._pool.connection() as conn:
                cur = await conn.execute(
                    "INSERT INTO guardrail_policies (team_id, policy) SELECT id, %s FROM teams WHERE id = %s"
                    " ON CONFLICT (team_id) DO UPDATE SET policy = EXCLUDED.policy, updated_at = now()"
                    " RETURNING updated_at",
                    (Jsonb(policy.as_json()), team_id),
                )
                row = await cur.fetchone()
        except psycopg.errors.ForeignKeyViolation:  # the team was deleted meanwhile
            row = None
        self._forget(team_id)
        if row is None:
            raise _team_not_found(team_id)
        return StoredPolicy(team_id, policy, row[0])

    @postgres_boundary()
    async def delete(self, team_id: int) -> bool:
        """Remove the team's policy (False: it had none); `NotFound` for a team that does not exist."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "WITH team AS (SELECT id FROM teams WHERE id = %s),"
                " gone AS (DELETE FROM guardrail_policies g USING team WHERE g.team_id = team.id RETURNING 1)"
                " SELECT (SELECT count(*) FROM team), (SELECT count(*) FROM gone)",
                (team_id,),
            )
            row = await cur.fetchone()
        self._forget(team_id)
        if row is None or row[0] == 0:
            raise _team_not_found(team_id)
        return bool(row[1])

    def _forget(self, team_id: int) -> None:
        self._cache.forget(team_id)

    async def compiled(self, team_id: int) -> CompiledPolicy | None:
        """The team's policy, compiled, for the request path (None: no guardrails), cached."""
        return await self._cache.get(team_id)

    @postgres_boundary()
    async def _load(self, team_id: int) -> CompiledPolicy | None:
        self.db_lookups += 1
        async with self._pool.connection() as conn:
            cur = await conn.execute("SELECT policy FROM guardrail_policies WHERE team_id = %s", (team_id,))
            row = await cur.fetchone()
        return None if row is None else compile_policy(_stored(team_id, row[0]))
