"""API keys: creation (shown once), listing (never the key), revocation, and cached lookup.

Keys look like `sk-lf-<43 chars>`; the table stores only `HMAC-SHA256(server key, key)`.
Lookups are served from a small per-process cache whose entries live `cache_ttl_s`
(default 4 s): a revocation or an expiry written by any replica is seen by every replica
within 5 s, and the revoking replica drops its own entry at once. Expiry is also checked
against the clock on every request, so an expired key fails even from the cache.
Unknown keys are cached negatively for a shorter time so a flood of bad keys does not
reach PostgreSQL on every request.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from psycopg_pool import AsyncConnectionPool

from apps.core.errors import AuthenticationFailed, InvalidRequest, NotFound
from apps.core.identity.principal import Principal
from apps.core.ledger.teams import TeamRef, team_where
from apps.core.quota.admission import Limits, TeamLimits
from apps.core.secrets import hash_secret, new_secret
from apps.core.sharing import PriorityClass

KEY_PREFIX = "sk-lf"


@dataclass(frozen=True)
class KeyRecord:
    id: int
    team_id: int
    team_name: str
    prefix: str
    name: str | None
    model_allowlist: tuple[str, ...]
    rpm: int | None
    tokens_per_day: int | None
    max_streams: int | None
    expires_at: datetime | None
    revoked_at: datetime | None
    created_at: datetime
    max_tokens: int | None = None  # the most completion tokens one request may ask for (per choice)
    max_context: int | None = None  # the most prompt (the gateway's bound) + max_tokens one request may use
    team_weight: float = 1.0
    priority_class: PriorityClass = PriorityClass.INTERACTIVE
    team_max_streams: int | None = None
    team_tokens_per_minute: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "team_id": self.team_id,
            "team": self.team_name,
            "prefix": self.prefix,
            "name": self.name,
            "model_allowlist": list(self.model_allowlist),
            "rpm": self.rpm,
            "tokens_per_day": self.tokens_per_day,
            "max_streams": self.max_streams,
            "max_tokens": self.max_tokens,
            "max_context": self.max_context,
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
            "created_at": self.created_at.isoformat(),
            "priority_class": self.priority_class.value,
        }

    def principal(self) -> Principal:
        return Principal(
            kind="api_key",
            subject=str(self.id),
            team_id=self.team_id,
            team_name=self.team_name,
            key_id=self.id,
            model_allowlist=self.model_allowlist,
            limits=Limits(
                self.max_streams,
                self.rpm,
                self.tokens_per_day,
                TeamLimits(self.team_id, self.team_max_streams, self.team_tokens_per_minute),
            ),
            expires_at=self.expires_at,
            max_tokens=self.max_tokens,
            max_context=self.max_context,
            team_weight=self.team_weight,
            priority_class=self.priority_class,
        )


_SELECT = (
    "SELECT k.id, k.team_id, t.name, k.prefix, k.name, k.model_allowlist, k.rpm, k.tokens_per_day, "
    "k.max_streams, k.expires_at, k.revoked_at, k.created_at, k.max_tokens, k.max_context, t.weight, "
    "k.priority_class, t.max_streams, t.tokens_per_minute "
    "FROM api_keys k JOIN teams t ON t.id = k.team_id "
)


def _record(row: Sequence[Any]) -> KeyRecord:
    return KeyRecord(
        id=int(row[0]),
        team_id=int(row[1]),
        team_name=str(row[2]),
        prefix=str(row[3]),
        name=row[4],
        model_allowlist=tuple(row[5] or ()),
        rpm=row[6],
        tokens_per_day=row[7],
        max_streams=row[8],
        expires_at=row[9],
        revoked_at=row[10],
        created_at=row[11],
        max_tokens=row[12],
        max_context=row[13],
        team_weight=float(row[14]),
        priority_class=PriorityClass(row[15]),
        team_max_streams=row[16],
        team_tokens_per_minute=row[17],
    )


# The limits an admin sets on a key; `update` changes only the ones it is given.
LIMIT_FIELDS = ("rpm", "tokens_per_day", "max_streams", "max_tokens", "max_context")


class KeyStore:
    def __init__(
        self,
        pool: AsyncConnectionPool,
        secret_key: bytes,
        *,
        cache_ttl_s: float = 4.0,
        negative_ttl_s: float = 1.0,
        max_entries: int = 10_000,
        monotonic: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._pool = pool
        self._secret = secret_key
        self._ttl = cache_ttl_s
        self._neg_ttl = negative_ttl_s
        self._max = max_entries
        self._mono = monotonic
        self._now = now
        self._cache: OrderedDict[str, tuple[float, KeyRecord | None]] = OrderedDict()
        # One lookup per key at a time (concurrent misses share it), and a key in use is re-read in
        # the background during the last quarter of its TTL, so requests of a busy key do not wait
        # for PostgreSQL every TTL. Expiry is unchanged: past its TTL an entry is never served.
        self._loading: dict[str, asyncio.Future[KeyRecord | None]] = {}
        self._refresh_ahead_s = cache_ttl_s / 4
        self.db_lookups = 0

    async def create(
        self,
        *,
        team: TeamRef,
        model_allowlist: Sequence[str] = (),
        rpm: int | None = None,
        tokens_per_day: int | None = None,
        max_streams: int | None = None,
        expires_at: datetime | None = None,
        name: str | None = None,
        max_tokens: int | None = None,
        max_context: int | None = None,
        priority_class: PriorityClass = PriorityClass.INTERACTIVE,
    ) -> tuple[str, KeyRecord]:
        """Returns `(key, record)`; the key is never retrievable again."""
        limits = {
            "rpm": rpm,
            "tokens_per_day": tokens_per_day,
            "max_streams": max_streams,
            "max_tokens": max_tokens,
            "max_context": max_context,
        }
        for field, value in limits.items():
            if value is not None and value <= 0:
                raise InvalidRequest(f"{field} must be positive", param=field)
        if expires_at is not None and expires_at.tzinfo is None:
            expires_at = expires_at.replace(tzinfo=UTC)
        secret = new_secret(KEY_PREFIX)
        where, param = team_where(team)
        async with self._pool.connection() as conn:
            cur = await conn.execute(f"SELECT t.id FROM teams t WHERE {where}".encode(), (param,))  # noqa: S608 (constant)
            row = await cur.fetchone()
            if row is None:
                raise NotFound(f"team {team!r} does not exist", param="team", code="team_not_found")
            cur = await conn.execute(
                "INSERT INTO api_keys (team_id, hash, prefix, name, model_allowlist, rpm, tokens_per_day, "
                "max_streams, expires_at, max_tokens, max_context, priority_class) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
                (
                    row[0],
                    hash_secret(secret, self._secret),
                    secret[:12],
                    name,
                    list(model_allowlist),
                    rpm,
                    tokens_per_day,
                    max_streams,
                    expires_at,
                    max_tokens,
                    max_context,
                    priority_class.value,
                ),
            )
            new = await cur.fetchone()
            assert new is not None
            cur = await conn.execute((_SELECT + "WHERE k.id = %s").encode(), (new[0],))
            rec = await cur.fetchone()
        assert rec is not None
        return secret, _record(rec)

    async def list_keys(self, team: TeamRef | None = None) -> list[KeyRecord]:
        """Every key, or one team's: `team` an `int` (id) or a `str` (name)."""
        async with self._pool.connection() as conn:
            if team is None:
                cur = await conn.execute((_SELECT + "ORDER BY k.id").encode())
            else:
                where, param = team_where(team)
                cur = await conn.execute((_SELECT + f"WHERE {where} ORDER BY k.id").encode(), (param,))
            return [_record(r) for r in await cur.fetchall()]

    async def update(self, key_id: int, changes: dict[str, int | None]) -> KeyRecord:
        """Set (or, with None, clear) some of a key's limits (`LIMIT_FIELDS`); every replica uses
        them within the cache TTL (5 s), this one at once."""
        unknown = [f for f in changes if f not in LIMIT_FIELDS]
        if unknown:
            raise InvalidRequest(f"unknown key limit: {unknown[0]}", param=unknown[0])
        for field, value in changes.items():
            if value is not None and value <= 0:
                raise InvalidRequest(f"{field} must be positive", param=field)
        async with self._pool.connection() as conn:
            if changes:
                assignments = ", ".join(f"{f} = %s" for f in changes)  # names from LIMIT_FIELDS only
                cur = await conn.execute(
                    f"UPDATE api_keys SET {assignments} WHERE id = %s RETURNING hash".encode(),  # noqa: S608
                    (*changes.values(), key_id),
                )
                row = await cur.fetchone()
                if row is not None:
                    self._cache.pop(str(row[0]), None)
            cur = await conn.execute((_SELECT + "WHERE k.id = %s").encode(), (key_id,))
            rec = await cur.fetchone()
        if rec is None:
            raise NotFound(f"key {key_id} does not exist", param="id", code="key_not_found")
        return _record(rec)

    async def revoke(self, key_id: int) -> bool:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "UPDATE api_keys SET revoked_at = now() WHERE id = %s AND revoked_at IS NULL RETURNING hash",
                (key_id,),
            )
            row = await cur.fetchone()
            if row is None:
                cur = await conn.execute("SELECT 1 FROM api_keys WHERE id = %s", (key_id,))
                if await cur.fetchone() is None:
                    raise NotFound(f"key {key_id} does not exist", param="id", code="key_not_found")
                return False
        self._cache.pop(str(row[0]), None)
        return True

    async def authenticate(self, secret: str) -> Principal:
        """The key's principal, or `AuthenticationFailed` (401) for unknown, revoked or expired keys."""
        if not secret.startswith(KEY_PREFIX + "-") or len(secret) > 200:
            raise AuthenticationFailed("Incorrect API key provided.")
        digest = hash_secret(secret, self._secret)
        mono = self._mono()
        hit = self._cache.get(digest)
        if hit is not None and hit[0] > mono:
            record = hit[1]
            if record is not None and hit[0] - mono < self._refresh_ahead_s:
                self._lookup(digest)  # in the background; this request is served from the cache
        else:
            record = await asyncio.shield(self._lookup(digest))
        if record is None or record.revoked_at is not None:
            raise AuthenticationFailed("Incorrect API key provided.")
        if record.expires_at is not None and record.expires_at <= self._now():
            raise AuthenticationFailed("The API key has expired.", code="expired_api_key")
        return record.principal()

    def _lookup(self, digest: str) -> asyncio.Future[KeyRecord | None]:
        """The key's lookup in flight, started if there is none; it caches what it read."""
        running = self._loading.get(digest)
        if running is not None and not running.done():
            return running
        started = self._mono()

        async def load() -> KeyRecord | None:
            record = await self._load(digest)
            ttl = self._ttl if record is not None else self._neg_ttl
            self._cache[digest] = (started + ttl, record)
            self._cache.move_to_end(digest)
            while len(self._cache) > self._max:
                self._cache.popitem(last=False)
            return record

        task = asyncio.ensure_future(load())
        self._loading[digest] = task

        def finished(done: asyncio.Future[KeyRecord | None]) -> None:
            if self._loading.get(digest) is done:
                del self._loading[digest]
            if not done.cancelled():
                done.exception()  # a failed background refresh: the entry just expires

        task.add_done_callback(finished)
        return task

    async def _load(self, digest: str) -> KeyRecord | None:
        self.db_lookups += 1
        async with self._pool.connection() as conn:
            cur = await conn.execute((_SELECT + "WHERE k.hash = %s").encode(), (digest,))
            row = await cur.fetchone()
        return _record(row) if row is not None else None
