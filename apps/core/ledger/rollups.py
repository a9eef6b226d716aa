"""Usage rollups for the console: daily per team/model/key totals (the response cache's part too),
recent requests, key last use.

`usage_daily` (migration 0005) is maintained by a trigger on the ledger row's
`reserved -> settled` update, in the settle's own transaction, so for any whole-UTC-day
range its totals equal the settled ledger rows' totals (tested property-style against the
raw ledger). A year of a team's usage is then at most 366 x models x keys rows, which is
what makes the console's pages fast on a million ledger rows. Every query is scoped by a
team id the caller verified (or none, for the admin's all-teams view).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from psycopg_pool import AsyncConnectionPool

# Keys of `usage_daily` rows made without a key (JWT callers).
NO_KEY = 0


@dataclass(frozen=True)
class DailyUsage:
    day: date
    model: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cost_microcredits: int
    cached_prompt_tokens: int = 0  # of prompt_tokens, billed at the cached price

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_json(self) -> dict[str, Any]:
        return {
            "day": self.day.isoformat(),
            "model": self.model,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "cost_microcredits": self.cost_microcredits,
        }


@dataclass(frozen=True)
class CacheUse:
    """The response cache's part of one team's usage of one model over some UTC days (migration 0018).
    `hits`: requests answered from the cache (billed at the model's cache price); `misses`: requests it
    was asked for and the fleet answered; `lookups`: semantic lookups' question embeddings, on the
    embedding model's row. Settled requests only, like every rollup."""

    team_id: int
    model: str
    hits: int
    misses: int
    hit_completion_tokens: int
    hit_cost_microcredits: int
    lookups: int = 0
    lookup_cost_microcredits: int = 0


@dataclass(frozen=True)
class RecentRequest:
    request_id: str
    created_at: datetime
    model: str
    key_id: int | None
    status: str
    prompt_tokens: int
    completion_tokens: int
    cost_microcredits: int
    latency_s: float | None


def _scope(team_id: int | None, key_id: int | None) -> tuple[str, list[Any]]:
    where, params = [], []
    if team_id is not None:
        where.append("team_id = %s")
        params.append(team_id)
    if key_id is not None:
        where.append("key_id = %s")
        params.append(key_id)
    return " AND ".join(where) or "TRUE", params


class UsageRollups:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool

    async def _grouped(
        self,
        select: str,
        team_id: int | None,
        start: date,
        end: date,
        key_id: int | None,
        model: str | None,
        also: str = "",
    ) -> list[Any]:
        """`SELECT <select> FROM usage_daily` over the scope's UTC days `[start, end)` (and `also`, a
        constant condition), grouped and ordered by the first two columns."""
        where, params = _scope(team_id, key_id)
        if model is not None:
            where += " AND model = %s"
            params.append(model)
        query = (
            f"SELECT {select} FROM usage_daily WHERE {where} AND day >= %s AND day < %s {also} "  # noqa: S608 (constants)
            "GROUP BY 1, 2 ORDER BY 1, 2"
        )
        async with self._pool.connection() as conn:
            cur = await conn.execute(query.encode(), (*params, start, end))
            return list(await cur.fetchall())

    async def daily(
        self,
        team_id: int | None,
        start: date,
        end: date,
        *,
        key_id: int | None = None,
        model: str | None = None,
    ) -> list[DailyUsage]:
        """Per UTC day and model in `[start, end)` (days), summed over keys unless `key_id` is given."""
        rows = await self._grouped(
            "day, model, SUM(requests), SUM(prompt_tokens), SUM(completion_tokens), SUM(cost_microcredits), "
            "SUM(cached_prompt_tokens)",
            team_id, start, end, key_id, model,
        )  # fmt: skip
        return [
            DailyUsage(r[0], str(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]), int(r[6])) for r in rows
        ]

    async def cache_use(
        self,
        team_id: int | None,
        start: date,
        end: date,
        *,
        key_id: int | None = None,
        model: str | None = None,
    ) -> list[CacheUse]:
        """Per team and model over the UTC days `[start, end)`, the rows the cache took part in."""
        rows = await self._grouped(
            "team_id, model, SUM(cache_hits), SUM(cache_misses), SUM(cache_hit_completion_tokens), "
            "SUM(cache_hit_cost_microcredits), SUM(cache_lookups), SUM(cache_lookup_cost_microcredits)",
            team_id, start, end, key_id, model,
            also="AND (cache_hits > 0 OR cache_misses > 0 OR cache_lookups > 0)",
        )  # fmt: skip
        return [CacheUse(int(r[0]), str(r[1]), *(int(v) for v in r[2:])) for r in rows]

    async def key_last_used(self, team_id: int | None) -> dict[int, datetime]:
        where, params = _scope(team_id, None)
        query = f"SELECT key_id, max(last_at) FROM usage_daily WHERE {where} AND key_id <> 0 GROUP BY 1"  # noqa: S608
        async with self._pool.connection() as conn:
            cur = await conn.execute(query.encode(), params)
            return {int(r[0]): r[1] for r in await cur.fetchall()}

    async def recent(
        self, team_id: int, *, key_id: int | None = None, limit: int = 50
    ) -> list[RecentRequest]:
        """The newest ledger rows (metadata only: the ledger holds no prompt or completion)."""
        where, params = _scope(team_id, key_id)
        query = (
            "SELECT request_id, created_at, model, key_id, status::text, prompt_tokens, completion_tokens, "  # noqa: S608
            "cost_microcredits, EXTRACT(EPOCH FROM finalized_at - created_at) "
            f"FROM usage_ledger WHERE {where} ORDER BY created_at DESC LIMIT %s"
        )
        async with self._pool.connection() as conn:
            cur = await conn.execute(query.encode(), (*params, limit))
            rows = await cur.fetchall()
        return [
            RecentRequest(
                str(r[0]),
                r[1],
                str(r[2]),
                r[3],
                str(r[4]),
                int(r[5]),
                int(r[6]),
                int(r[7]),
                float(r[8]) if r[8] is not None else None,
            )
            for r in rows
        ]

    async def status_counts(
        self, team_id: int, since: datetime, *, key_id: int | None = None
    ) -> dict[str, int]:
        """Ledger rows per status since `since` (a cancelled row: admitted, then nothing served it)."""
        where, params = _scope(team_id, key_id)
        query = (
            f"SELECT status::text, count(*) FROM usage_ledger WHERE {where} AND created_at >= %s GROUP BY 1"  # noqa: S608
        )
        async with self._pool.connection() as conn:
            cur = await conn.execute(query.encode(), (*params, since))
            return {str(r[0]): int(r[1]) for r in await cur.fetchall()}

    async def claim_signin(self, token: str) -> bool:
        """True the first time a sign-in link's token is used, False ever after."""
        digest = hashlib.sha256(token.encode()).hexdigest()
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "INSERT INTO console_signin_used (token_sha256) VALUES (%s) ON CONFLICT DO NOTHING RETURNING 1",
                (digest,),
            )
            return await cur.fetchone() is not None


def burn_rate(rows: list[DailyUsage], today: date, days: int = 7) -> float:
    """Average microcredits per day over the last `days` days up to and including `today`."""
    since = today - timedelta(days=days - 1)
    return sum(r.cost_microcredits for r in rows if since <= r.day <= today) / days


def days_left(balance_microcredits: int, burn_per_day: float) -> float | None:
    return balance_microcredits / burn_per_day if burn_per_day > 0 else None
