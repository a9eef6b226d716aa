"""`TeamDocuments`: one JSON document per team in a table `(team_id REFERENCES teams ON DELETE CASCADE,
policy JSONB, updated_at)`, written by an admin route and read by the request path: the team guardrail
policies (`guardrail_policies`, migration 0016) and the response cache policies (`response_cache_policies`,
0017). `get`, `put` and `delete` tell a team that does not exist (404 `team_not_found`) from one without a
document; `load` is the request path's read (no team check: the caller authenticated the team).

A stored document is validated again when it is read (`validate`: the rules may have tightened since it was
saved); one that no longer validates is a 503 naming the team, until an admin saves it again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

import psycopg.errors
from psycopg import sql
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from apps.core.errors import NotFound
from apps.core.stores import postgres_boundary
from apps.core.ttlcache import TtlCache


class Document(Protocol):
    def as_json(self) -> dict[str, Any]: ...


D = TypeVar("D", bound=Document)


def team_not_found(team_id: int) -> NotFound:
    return NotFound(f"team {team_id} does not exist", param="team_id", code="team_not_found")


@dataclass(frozen=True)
class StoredDocument(Generic[D]):
    team_id: int
    policy: D
    updated_at: datetime

    def as_json(self) -> dict[str, Any]:
        return {
            "team_id": self.team_id,
            "policy": self.policy.as_json(),
            "updated_at": self.updated_at.isoformat(),
        }


class TeamDocuments(Generic[D]):
    def __init__(self, pool: AsyncConnectionPool, table: str, validate: Callable[[int, object], D]) -> None:
        self._pool = pool
        self._table = sql.Identifier(table)
        self._validate = validate

    @postgres_boundary()
    async def get(self, team_id: int) -> StoredDocument[D] | None:
        """The team's document (None: it has none); `NotFound` for a team that does not exist."""
        query = sql.SQL(
            "SELECT d.policy, d.updated_at FROM teams t LEFT JOIN {} d ON d.team_id = t.id WHERE t.id = %s"
        ).format(self._table)
        async with self._pool.connection() as conn:
            cur = await conn.execute(query, (team_id,))
            row = await cur.fetchone()
        if row is None:
            raise team_not_found(team_id)
        return None if row[0] is None else StoredDocument(team_id, self._validate(team_id, row[0]), row[1])

    @postgres_boundary()
    async def put(self, team_id: int, document: D) -> StoredDocument[D]:
        """Save (replace) the team's document; `NotFound` for a team that does not exist."""
        query = sql.SQL(
            "INSERT INTO {} (team_id, policy) SELECT id, %s FROM teams WHERE id = %s"
            " ON CONFLICT (team_id) DO UPDATE SET policy = EXCLUDED.policy, updated_at = now()"
            " RETURNING updated_at"
        ).format(self._table)
        try:
            async with self._pool.connection() as conn:
                cur = await conn.execute(query, (Jsonb(document.as_json()), team_id))
                row = await cur.fetchone()
        except psycopg.errors.ForeignKeyViolation:  # the team was deleted meanwhile
            row = None
        if row is None:
            raise team_not_found(team_id)
        return StoredDocument(team_id, document, row[0])

    @postgres_boundary()
    async def delete(self, team_id: int) -> bool:
        """Remove the team's document (False: it had none); `NotFound` for a team that does not exist."""
        query = sql.SQL(
            "WITH team AS (SELECT id FROM teams WHERE id = %s),"
            " gone AS (DELETE FROM {} d USING team WHERE d.team_id = team.id RETURNING 1)"
            " SELECT (SELECT count(*) FROM team), (SELECT count(*) FROM gone)"
        ).format(self._table)
        async with self._pool.connection() as conn:
            cur = await conn.execute(query, (team_id,))
            row = await cur.fetchone()
        if row is None or row[0] == 0:
            raise team_not_found(team_id)
        return bool(row[1])

    @postgres_boundary()
    async def load(self, team_id: int) -> D | None:
        """The request path's read: the team's document, or None."""
        query = sql.SQL("SELECT policy FROM {} WHERE team_id = %s").format(self._table)
        async with self._pool.connection() as conn:
            cur = await conn.execute(query, (team_id,))
            row = await cur.fetchone()
        return None if row is None else self._validate(team_id, row[0])


V = TypeVar("V")


class CachedTeamDocuments(TeamDocuments[D], Generic[D, V]):
    """`TeamDocuments` whose request-path read (`cached`) goes through a per-process `TtlCache` of each team's
    document prepared for use (`prepare`: compiled patterns, or the document as it is). A write on this process
    drops the team's entry at once; other processes see it within `ttl_s`."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        table: str,
        validate: Callable[[int, object], D],
        prepare: Callable[[D], V],
        *,
        ttl_s: float = 4.0,
        max_entries: int = 10_000,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(pool, table, validate)
        self._prepare = prepare
        self._cache: TtlCache[int, V | None] = TtlCache(
            self._prepared, ttl_s=ttl_s, max_entries=max_entries, monotonic=monotonic
        )
        self.db_lookups = 0

    async def put(self, team_id: int, document: D) -> StoredDocument[D]:
        try:
            return await super().put(team_id, document)
        finally:
            self._cache.forget(team_id)

    async def delete(self, team_id: int) -> bool:
        try:
            return await super().delete(team_id)
        finally:
            self._cache.forget(team_id)

    async def cached(self, team_id: int) -> V | None:
        """The team's document prepared, for the request path (None: it has none), cached."""
        return await self._cache.get(team_id)

    async def _prepared(self, team_id: int) -> V | None:
        self.db_lookups += 1
        document = await self.load(team_id)
        return None if document is None else self._prepare(document)
