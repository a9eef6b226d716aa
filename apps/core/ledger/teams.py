"""Teams, credits and usage reports over PostgreSQL (the admin and `/v1/usage` side of the ledger).

Every credit movement is a `credit_entries` row written in the same transaction as the
balance change, so `balance == sum(credit_entries) - sum(settled cost)` is checkable.
Usage reports are always scoped by a team id the caller verified (never by a request
parameter); the query is bounded by the `[from, to)` interval.

A team is named by exactly one kind of identifier: an `int` is always its id, a `str` always its
name (an all-digit name such as "2" is a name, never an id). The admin API and the JWT claim
mapping say which one they mean (`team_id` / `team`); nothing guesses from the value's shape.
Names are 1-64 of [A-Za-z0-9._-], unique regardless of case (migration 0004).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg.errors
from psycopg_pool import AsyncConnectionPool

from apps.core.errors import InvalidRequest, LlmfleetError, NotFound
from apps.core.quota.admission import TeamLimits
from apps.core.sharing import ALL_CLASSES, PriorityClass, team_weight

TEAM_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
TeamRef = int | str  # int: the team's id; str: its name


def team_where(ref: TeamRef) -> tuple[str, int | str]:
    """The SQL condition (on alias `t`) and parameter selecting one team by id or by name."""
    if isinstance(ref, bool) or not isinstance(ref, int | str):
        raise InvalidRequest("a team is named by its id (integer) or its name (string)", param="team")
    return ("t.id = %s", ref) if isinstance(ref, int) else ("t.name = %s", ref)


class Conflict(LlmfleetError):
    status = 409
    type = "invalid_request_error"
    code = "conflict"


@dataclass(frozen=True)
class Team:
    id: int
    name: str
    balance_microcredits: int
    weight: float = 1.0  # in the orchestrators' weighted fair queue (`apps.core.sharing`)
    # On top of its keys' limits, checked in the same admission script (None: none).
    max_streams: int | None = None
    tokens_per_minute: int | None = None
    # The classes the admin lets the team use for the keys it creates in the console.
    priority_classes: tuple[PriorityClass, ...] = ALL_CLASSES

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "balance_microcredits": self.balance_microcredits,
            "weight": self.weight,
            "max_streams": self.max_streams,
            "tokens_per_minute": self.tokens_per_minute,
            "priority_classes": [c.value for c in self.priority_classes],
        }

    def limits(self) -> TeamLimits:
        return TeamLimits(self.id, self.max_streams, self.tokens_per_minute)


_TEAM_COLUMNS = (
    "t.id, t.name, t.balance_microcredits, t.weight, t.max_streams, t.tokens_per_minute, t.priority_classes"
)
UNCHANGED: Any = object()  # `set_sharing`: leave this field as it is


def _team(row: Any) -> Team:
    classes = tuple(c for c in PriorityClass if c.value in row[6])
    return Team(int(row[0]), str(row[1]), int(row[2]), float(row[3]), row[4], row[5], classes)


class TeamStore:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool

    async def create_team(
        self,
        name: str,
        weight: float = 1.0,
        credits_microcredits: int = 0,
        priority_classes: tuple[PriorityClass, ...] = ALL_CLASSES,
    ) -> Team:
        """A new team, with its initial credits (a `credit_entries` row, reason "initial") in the
        same transaction: a refused credit leaves no team behind."""
        if not TEAM_NAME_RE.match(name):
            raise InvalidRequest(
                "team name must be 1-64 of [A-Za-z0-9._-], starting with a letter or digit", param="name"
            )
        if credits_microcredits < 0:
            raise InvalidRequest("initial credits must not be negative", param="credits")
        try:
            async with self._pool.connection() as conn, conn.transaction():
                cur = await conn.execute(
                    b"INSERT INTO teams AS t (name, weight, balance_microcredits, priority_classes) "
                    + f"VALUES (%s, %s, %s, %s) RETURNING {_TEAM_COLUMNS}".encode(),
                    (name, team_weight(weight), credits_microcredits, [c.value for c in priority_classes]),
                )
                row = await cur.fetchone()
                assert row is not None
                if credits_microcredits:
                    await conn.execute(
                        "INSERT INTO credit_entries (team_id, amount_microcredits, reason) VALUES (%s, %s, 'initial')",
                        (row[0], credits_microcredits),
                    )
        except psycopg.errors.UniqueViolation:  # also a name differing only in case
            raise Conflict(f"team {name!r} already exists", param="name") from None
        return _team(row)

    async def list_teams(self) -> list[Team]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(f"SELECT {_TEAM_COLUMNS} FROM teams t ORDER BY t.id".encode())  # noqa: S608 (constant)
            return [_team(r) for r in await cur.fetchall()]

    async def get_team(self, ref: TeamRef) -> Team:
        """A team by id (an `int`) or by name (a `str`, whatever its characters)."""
        where, param = team_where(ref)
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {_TEAM_COLUMNS} FROM teams t WHERE {where}".encode(),  # noqa: S608 (constant)
                (param,),
            )
            row = await cur.fetchone()
        if row is None:
            raise NotFound(f"team {ref!r} does not exist", param="team", code="team_not_found")
        return _team(row)

    async def set_sharing(
        self,
        ref: TeamRef,
        *,
        weight: float | None = None,
        max_streams: int | None = UNCHANGED,
        tokens_per_minute: int | None = UNCHANGED,
        priority_classes: tuple[PriorityClass, ...] | None = None,
    ) -> Team:
        """Set a team's fair-queue weight, limits and classes (None clears a limit; `UNCHANGED` leaves it).
        A team that does not exist is a 400 on `team` (the body named it), not a 404: the caller
        sent settings for nobody."""
        where, param = team_where(ref)
        sets: list[str] = []
        values: list[Any] = []
        if weight is not None:
            sets.append("weight = %s")
            values.append(team_weight(weight))
        for name, value in (("max_streams", max_streams), ("tokens_per_minute", tokens_per_minute)):
            if value is not UNCHANGED:
                sets.append(f"{name} = %s")
                values.append(value)
        if priority_classes is not None:
            sets.append("priority_classes = %s")
            values.append([c.value for c in priority_classes])
        if not sets:
            raise InvalidRequest(
                "nothing to set: give 'weight', 'max_streams', 'tokens_per_minute' or 'priority_classes'",
                param="weight",
            )
        query = f"UPDATE teams t SET {', '.join(sets)} WHERE {where} RETURNING {_TEAM_COLUMNS}"  # noqa: S608 (constant)
        async with self._pool.connection() as conn:
            cur = await conn.execute(query.encode(), (*values, param))
            row = await cur.fetchone()
        if row is None:
            raise InvalidRequest(f"team {ref!r} does not exist", param="team")
        return _team(row)

    async def add_credits(
        self, team: TeamRef, amount_microcredits: int, reason: str = "admin"
    ) -> dict[str, Any]:
        if amount_microcredits == 0:
            raise InvalidRequest("amount must not be zero", param="amount")
        found = await self.get_team(team)
        async with self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "UPDATE teams SET balance_microcredits = balance_microcredits + %s "
                "WHERE id = %s AND balance_microcredits + %s >= 0 RETURNING balance_microcredits",
                (amount_microcredits, found.id, amount_microcredits),
            )
            row = await cur.fetchone()
            if row is None:
                raise InvalidRequest("a debit may not make the balance negative", param="amount")
            cur = await conn.execute(
                "INSERT INTO credit_entries (team_id, amount_microcredits, reason) VALUES (%s, %s, %s) "
                "RETURNING id, created_at",
                (found.id, amount_microcredits, reason),
            )
            entry = await cur.fetchone()
        assert entry is not None
        return {
            "id": int(entry[0]),
            "team_id": found.id,
            "team": found.name,
            "amount_microcredits": amount_microcredits,
            "balance_microcredits": int(row[0]),
            "created_at": entry[1].isoformat(),
        }

    async def usage(
        self, team_id: int, start: datetime, end: datetime, *, by_day: bool = False
    ) -> list[dict[str, Any]]:
        """Settled tokens and cost per model (and per UTC day) in `[start, end)` for one team."""
        day = "to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD')" if by_day else "NULL::text"
        query = (
            f"SELECT model, {day} AS day, count(*), COALESCE(SUM(prompt_tokens), 0), "  # noqa: S608 (constant)
            "COALESCE(SUM(completion_tokens), 0), COALESCE(SUM(cost_microcredits), 0), "
            "COALESCE(SUM(cached_prompt_tokens), 0) "
            "FROM usage_ledger WHERE team_id = %s AND status = 'settled' AND created_at >= %s AND created_at < %s "
            "GROUP BY 1, 2 ORDER BY 2 NULLS FIRST, 1"
        )
        async with self._pool.connection() as conn:
            cur = await conn.execute(query.encode(), (team_id, start, end))
            rows = await cur.fetchall()
        out: list[dict[str, Any]] = []
        for model, bucket, n, prompt, completion, cost, cached in rows:
            item: dict[str, Any] = {
                "model": model,
                "requests": int(n),
                "prompt_tokens": int(prompt),
                "cached_prompt_tokens": int(cached),  # of prompt_tokens, billed at the cached price
                "completion_tokens": int(completion),
                "total_tokens": int(prompt) + int(completion),
                "cost_microcredits": int(cost),
            }
            if by_day:
                item["day"] = bucket
            out.append(item)
        return out
