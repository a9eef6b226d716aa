"""`CacheStore`: the response cache's entries in PostgreSQL (`response_cache`, migration 0017), sealed with
each team's key (`apps.core.respcache.sealing`), matched exactly (a unique index on the team, model,
revision and exact key) or semantically (pgvector's cosine distance `<=>` over the entries of one team,
model, revision and context key; no approximate index: the per-team size bound keeps that set small).

Every read and write names the team: no statement can return or touch another team's row, and an entry
moved to another team's row does not open (its associated data name the team). An entry that does not
open (its team's key was purged meanwhile) is deleted and counts as a miss. Expired entries are never
returned; `expire` deletes them (the gateways' janitor, every minute). Each write keeps the team's running
total of stored bytes; one that takes it over `max_bytes` drops the team's oldest entries down to 90% of it
(so the full ranking runs once per tenth of the bound's churn, not at every write).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from psycopg_pool import AsyncConnectionPool

from apps.core.errors import StoreUnavailable
from apps.core.respcache.entry import CachedAnswer
from apps.core.respcache.sealing import TeamKey, Unsealable, new_salt
from apps.core.stores import postgres_boundary
from apps.core.ttlcache import TtlCache


@dataclass(frozen=True)
class Scope:
    """Where an entry lives and is looked for: one team, one model, the revision that answers."""

    team_id: int
    model: str
    revision: str


@dataclass(frozen=True)
class Found:
    answer: CachedAnswer
    similarity: float  # 1.0 for an exact match


@dataclass(frozen=True)
class TeamStats:
    entries: int
    bytes: int
    hits: int


def vector_literal(values: Sequence[float]) -> str:
    return "[" + ",".join(repr(float(v)) for v in values) + "]"


_EXACT = """
WITH found AS (
    SELECT id, exact_key, sealed FROM response_cache
    WHERE team_id = %(team)s AND model = %(model)s AND revision = %(rev)s AND exact_key = %(key)s
      AND expires_at > now()
), counted AS (UPDATE response_cache r SET hits = hits + 1 FROM found WHERE r.id = found.id)
SELECT id, exact_key, sealed, 1.0 FROM found
"""

_SEMANTIC = """
WITH found AS (
    SELECT id, exact_key, sealed, 1 - (embedding <=> %(q)s::vector) AS similarity FROM response_cache
    WHERE team_id = %(team)s AND model = %(model)s AND revision = %(rev)s AND context_key = %(ctx)s
      AND embed_model = %(embedder)s AND embedding IS NOT NULL AND expires_at > now()
      AND vector_dims(embedding) = %(dims)s
    ORDER BY embedding <=> %(q)s::vector LIMIT 1
), counted AS (
    UPDATE response_cache r SET hits = hits + 1 FROM found
    WHERE r.id = found.id AND found.similarity >= %(threshold)s
)
SELECT id, exact_key, sealed, similarity FROM found WHERE similarity >= %(threshold)s
"""

_INSERT = """
INSERT INTO response_cache (team_id, model, revision, endpoint, exact_key, context_key, embed_model, {vector_col}
                            sealed, bytes, prompt_tokens, completion_tokens, expires_at)
VALUES (%(team)s, %(model)s, %(rev)s, %(endpoint)s, %(key)s, %(ctx)s, %(embedder)s, {vector_val}
        %(sealed)s, %(bytes)s, %(p)s, %(c)s, now() + make_interval(secs => %(ttl)s))
ON CONFLICT (team_id, model, revision, exact_key) DO UPDATE SET
    context_key = EXCLUDED.context_key, embed_model = EXCLUDED.embed_model, {vector_update}
    sealed = EXCLUDED.sealed, bytes = EXCLUDED.bytes, prompt_tokens = EXCLUDED.prompt_tokens,
    completion_tokens = EXCLUDED.completion_tokens, created_at = now(), expires_at = EXCLUDED.expires_at
"""

# After a write: the team's running total of stored bytes (the write's own bytes in, the replaced entry's out).
_ACCOUNT = """
UPDATE response_cache_keys SET stored_bytes = stored_bytes + %(bytes)s - %(replaced)s
WHERE team_id = %(team)s RETURNING stored_bytes
"""

# Over the bound: the team's oldest entries go until the newest ones left hold at most `target` bytes, and the
# running total is set to what is left, counted exactly (it corrects any drift of concurrent writes).
_EVICT = """
WITH ranked AS (
    SELECT id, sum(bytes) OVER (ORDER BY created_at DESC, id DESC) AS kept
    FROM response_cache WHERE team_id = %(team)s
), gone AS (
    DELETE FROM response_cache r USING ranked WHERE r.id = ranked.id AND ranked.kept > %(target)s
    RETURNING r.bytes
)
UPDATE response_cache_keys SET stored_bytes =
    (SELECT coalesce(sum(bytes), 0) FROM response_cache WHERE team_id = %(team)s)
    - (SELECT coalesce(sum(bytes), 0) FROM gone)
WHERE team_id = %(team)s
"""

# Expired entries of every team, oldest expiry first, in batches (the janitor), the teams' totals adjusted.
_EXPIRE = """
WITH gone AS (
    DELETE FROM response_cache WHERE id IN (
        SELECT id FROM response_cache WHERE expires_at <= now() ORDER BY expires_at LIMIT %(limit)s
    ) RETURNING team_id, bytes
), freed AS (SELECT team_id, sum(bytes) AS bytes, count(*) AS n FROM gone GROUP BY team_id),
adjusted AS (
    UPDATE response_cache_keys k SET stored_bytes = greatest(k.stored_bytes - freed.bytes, 0)
    FROM freed WHERE k.team_id = freed.team_id
)
SELECT coalesce(sum(n), 0) FROM freed
"""

EVICT_TO = 0.9  # an eviction frees down to this share of the bound, so it runs once per tenth of churn


class CacheStore:
    def __init__(
        self,
        pool: AsyncConnectionPool,
        secret: bytes,
        spec_revisions: Mapping[str, str],
        *,
        key_ttl_s: float = 60.0,
        revision_ttl_s: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pool = pool
        self._secret = secret
        self._spec_revisions = dict(spec_revisions)
        self._keys: TtlCache[int, TeamKey] = TtlCache(self._team_key, ttl_s=key_ttl_s, monotonic=monotonic)
        self._stable: TtlCache[None, dict[str, str]] = TtlCache(
            self._rollouts, ttl_s=revision_ttl_s, monotonic=monotonic
        )
        self._semantic: bool | None = None
        self.unsealable = 0  # entries deleted because they no longer opened

    async def key(self, team_id: int) -> TeamKey:
        return await self._keys.get(team_id)

    async def stable_revision(self, model: str) -> str | None:
        """The revision that answers the model's unpinned requests: its rollout's stable one, else the
        stack's (None: unknown model)."""
        return (await self._stable.get(None)).get(model, self._spec_revisions.get(model))

    @postgres_boundary()
    async def semantic_available(self) -> bool:
        """The server has pgvector and migration 0017 made the embedding column."""
        if self._semantic is None:
            async with self._pool.connection() as conn:
                cur = await conn.execute(
                    "SELECT count(*) FROM information_schema.columns"
                    " WHERE table_name = 'response_cache' AND column_name = 'embedding'"
                )
                row = await cur.fetchone()
            self._semantic = bool(row and row[0])
        return self._semantic

    @postgres_boundary()
    async def exact(self, scope: Scope, key: TeamKey, exact_key: bytes) -> Found | None:
        params = {"team": scope.team_id, "model": scope.model, "rev": scope.revision, "key": exact_key}
        return await self._one(_EXACT, params, scope, key)

    @postgres_boundary()
    async def semantic(
        self,
        scope: Scope,
        key: TeamKey,
        context_key: bytes,
        embedder: str,
        vector: Sequence[float],
        threshold: float,
    ) -> Found | None:
        params = {
            "team": scope.team_id,
            "model": scope.model,
            "rev": scope.revision,
            "ctx": context_key,
            "embedder": embedder,
            "q": vector_literal(vector),
            "dims": len(vector),
            "threshold": threshold,
        }
        return await self._one(_SEMANTIC, params, scope, key)

    async def _one(self, sql: str, params: dict[str, object], scope: Scope, key: TeamKey) -> Found | None:
        async with self._pool.connection() as conn:
            cur = await conn.execute(sql, params)
            row = await cur.fetchone()
            if row is None:
                return None
            entry_id, exact_key, sealed, similarity = row
            try:
                plain = key.open(bytes(sealed), scope.model, scope.revision, bytes(exact_key))
            except Unsealable:
                self.unsealable += 1
                await conn.execute(
                    "DELETE FROM response_cache WHERE id = %s AND team_id = %s", (entry_id, scope.team_id)
                )
                return None
        return Found(CachedAnswer.unpack(plain), float(similarity))

    @postgres_boundary()
    async def put(
        self,
        scope: Scope,
        key: TeamKey,
        answer: CachedAnswer,
        *,
        exact_key: bytes,
        context_key: bytes,
        embedder: str | None,
        vector: Sequence[float] | None,
        ttl_s: int,
        max_bytes: int,
    ) -> None:
        sealed = key.seal(answer.pack(), scope.model, scope.revision, exact_key)
        with_vector = vector is not None and await self.semantic_available()
        sql = _INSERT.format(
            vector_col="embedding," if with_vector else "",
            vector_val="%(q)s::vector," if with_vector else "",
            vector_update="embedding = EXCLUDED.embedding," if with_vector else "",
        )
        params = {
            "team": scope.team_id,
            "model": scope.model,
            "rev": scope.revision,
            "endpoint": answer.endpoint,
            "key": exact_key,
            "ctx": context_key,
            "embedder": embedder if with_vector else None,
            "q": vector_literal(vector) if with_vector and vector is not None else None,
            "sealed": sealed,
            "bytes": len(sealed),
            "p": answer.prompt_tokens,
            "c": answer.completion_tokens,
            "ttl": ttl_s,
        }
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT bytes FROM response_cache WHERE team_id = %(team)s AND model = %(model)s"
                " AND revision = %(rev)s AND exact_key = %(key)s FOR UPDATE",
                params,
            )
            replaced = await cur.fetchone()
            await conn.execute(sql, params)
            cur = await conn.execute(_ACCOUNT, {**params, "replaced": int(replaced[0]) if replaced else 0})
            total = await cur.fetchone()
            if total is not None and int(total[0]) > max_bytes:
                await conn.execute(_EVICT, {"team": scope.team_id, "target": int(max_bytes * EVICT_TO)})

    @postgres_boundary()
    async def expire(self, limit: int = 1000) -> int:
        """Delete up to `limit` expired entries of any team (the janitor's step); how many went."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(_EXPIRE, {"limit": limit})
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    @postgres_boundary()
    async def purge(self, team_id: int) -> int:
        """Delete every entry of the team and its key (a new key is made at its next entry)."""
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute("DELETE FROM response_cache WHERE team_id = %s", (team_id,))
            await conn.execute("DELETE FROM response_cache_keys WHERE team_id = %s", (team_id,))
            deleted = cur.rowcount
        self._keys.forget(team_id)
        return deleted

    @postgres_boundary()
    async def stats(self, team_id: int) -> TeamStats:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*), coalesce(sum(bytes), 0), coalesce(sum(hits), 0) FROM response_cache"
                " WHERE team_id = %s AND expires_at > now()",
                (team_id,),
            )
            row = await cur.fetchone()
        assert row is not None
        return TeamStats(int(row[0]), int(row[1]), int(row[2]))

    @postgres_boundary()
    async def _team_key(self, team_id: int) -> TeamKey:
        row = None
        async with self._pool.connection() as conn:
            # A second try sees the salt a concurrent first use committed after this statement's snapshot.
            for _ in range(2):
                cur = await conn.execute(
                    "WITH made AS (INSERT INTO response_cache_keys (team_id, salt) VALUES (%s, %s)"
                    " ON CONFLICT (team_id) DO NOTHING RETURNING salt)"
                    " SELECT salt FROM made UNION ALL SELECT salt FROM response_cache_keys WHERE team_id = %s",
                    (team_id, new_salt(), team_id),
                )
                row = await cur.fetchone()
                if row is not None:
                    break
        if row is None:
            raise StoreUnavailable("postgres")
        return TeamKey.derive(self._secret, team_id, bytes(row[0]))

    @postgres_boundary()
    async def _rollouts(self, _: None) -> dict[str, str]:
        async with self._pool.connection() as conn:
            cur = await conn.execute("SELECT model, stable_revision FROM model_rollouts")
            return {str(m): str(r) for m, r in await cur.fetchall()}
