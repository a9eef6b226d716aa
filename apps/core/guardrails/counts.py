"""Guardrail decisions per team and UTC day, for the console (docs/guardrails.md, "Where decisions are
counted").

Redis, two hashes per UTC month, each field a day's count: `guardrails:{team_id}:{YYYY-MM}` (the team
view's), field `{YYYY-MM-DD}:{direction}:{check}:{action}`, and `guardrails:all:{YYYY-MM}` (the admin
view's, every team in one read), field `{YYYY-MM-DD}:{team_id}:{direction}:{check}:{action}`. A month per
hash, not a day: the console's widest range (a year) is 13 reads, not 366. One request's decisions are one
pipelined round trip: each distinct (direction, check, action) incremented by how often it was decided,
and both hashes given their TTL again. Only counts: a decision names its check and action, never the text
it matched, and the field is all that is written. A month's hash expires `KEEP_DAYS` after its last
write, so every day is kept at least `KEEP_DAYS` (the console's widest range, 366 days, and a day); a range
reaching further back is read only from `kept_since`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from apps.core.guardrails.decisions import Decision
from apps.core.stores import redis_boundary

KEEP_DAYS = 367
ALL_TEAMS = "all"


def decisions_key(team: int | str, day: date) -> str:
    """The hash of the month holding `day`, of one team (`team`: its id) or of every team (`ALL_TEAMS`)."""
    return f"guardrails:{team}:{day.year:04d}-{day.month:02d}"


def _part(value: str) -> str:
    """A field's part: checks are `[a-z0-9_]` names and actions and directions words, so this only
    guards the format (a colon could never split a field wrongly, nor a long value grow it)."""
    return value[:64].replace(":", "_")


def _months(first: date, last: date) -> list[date]:
    """The first day of each month from `first`'s to `last`'s."""
    months, month = [], first.replace(day=1)
    while month <= last:
        months.append(month)
        month = (month + timedelta(days=31)).replace(day=1)
    return months


@dataclass(frozen=True)
class DecisionCount:
    direction: str
    check: str
    action: str
    count: int
    team_id: int | None = None  # set by `DecisionCounts.teams` (the admin view's read)


class DecisionCounts:
    """`count` for the gateway (a request's decisions), `team` and `teams` for the console (Redis,
    `redis.asyncio`)."""

    def __init__(self, redis: Any, clock: Callable[[], datetime]) -> None:
        self._redis = redis
        self._clock = clock

    @redis_boundary
    async def count(self, team_id: int, decisions: Iterable[Decision]) -> None:
        tally = Counter((_part(d.direction), _part(d.check), _part(d.action)) for d in decisions)
        if not tally:
            return
        day = self._clock().date()
        team_key, all_key = decisions_key(team_id, day), decisions_key(ALL_TEAMS, day)
        pipe = self._redis.pipeline(transaction=False)
        for (direction, check, action), n in sorted(tally.items()):
            what = f"{direction}:{check}:{action}"
            pipe.hincrby(team_key, f"{day.isoformat()}:{what}", n)
            pipe.hincrby(all_key, f"{day.isoformat()}:{team_id}:{what}", n)
        pipe.expire(team_key, KEEP_DAYS * 86_400)
        pipe.expire(all_key, KEEP_DAYS * 86_400)
        await pipe.execute()

    def kept_since(self) -> date:
        """The first UTC day whose counts are still kept."""
        return self._clock().date() - timedelta(days=KEEP_DAYS - 1)

    async def _read(
        self, owner: int | str, start: date, end_exclusive: date
    ) -> tuple[list[dict[Any, Any]], date, date]:
        """The hashes of the range's kept days (none after today), and those days' first and last."""
        first = max(start, self.kept_since())
        last = min(end_exclusive - timedelta(days=1), self._clock().date())
        if first > last:
            return [], first, last
        pipe = self._redis.pipeline(transaction=False)
        for month in _months(first, last):
            pipe.hgetall(decisions_key(owner, month))
        found: list[dict[Any, Any]] = await pipe.execute()
        return found, first, last

    @redis_boundary
    async def team(self, team_id: int, start: date, end_exclusive: date) -> list[DecisionCount]:
        """The team's decisions over the UTC days [start, end_exclusive), by direction, check, action."""
        return summarise(*await self._read(team_id, start, end_exclusive), with_team=False)

    @redis_boundary
    async def teams(self, start: date, end_exclusive: date) -> list[DecisionCount]:
        """Every team's, by team id, direction, check and action."""
        return summarise(*await self._read(ALL_TEAMS, start, end_exclusive), with_team=True)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _day(raw: str) -> date | None:
    try:
        return date.fromisoformat(raw)
    except ValueError:
        return None


def summarise(
    months: list[dict[Any, Any]], first: date, last: date, *, with_team: bool
) -> list[DecisionCount]:
    """The months' fields of the days `first` to `last` added up, in (team, direction, check, action)
    order; fields that do not parse are ignored."""
    totals: dict[tuple[int, str, str, str], int] = {}
    for fields in months:
        for raw_field, raw_value in fields.items():
            parts, value = _text(raw_field).split(":"), _text(raw_value)
            day = _day(parts[0])
            if day is None or not first <= day <= last or not value.lstrip("-").isdigit():
                continue
            team, rest = 0, parts[1:]
            if with_team:
                if not rest or not rest[0].isdigit():
                    continue
                team, rest = int(rest[0]), rest[1:]
            if len(rest) != 3:
                continue
            key = (team, rest[0], rest[1], rest[2])
            totals[key] = totals.get(key, 0) + int(value)
    return [
        DecisionCount(direction, check, action, n, team if with_team else None)
        for (team, direction, check, action), n in sorted(totals.items())
    ]
