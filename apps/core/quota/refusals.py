"""Refused requests per team and UTC day, for the console (429 and 503 by reason).

A refused request leaves no ledger row when it is refused before its reservation (a rate limit),
so the counts live in Redis: one hash per team and day, `refusals:{team_id}:{YYYY-MM-DD}`, field
`{status}:{reason}:{key_id}` (0: a JWT caller), incremented and given its TTL in one round trip. Only counts, never request
content. The hashes outlive the console's widest window (7 days) by one day, then expire.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from apps.core.stores import redis_boundary

KEEP_DAYS = 8
WINDOW_DAYS = 7


def refusals_key(team_id: int, day: date) -> str:
    return f"refusals:{team_id}:{day.isoformat()}"


@dataclass(frozen=True)
class RefusalCount:
    status: int
    reason: str
    today: int
    last_7_days: int


class RefusalStore:
    """`count` for the gateway's error path, `recent` for the console (Redis, `redis.asyncio`)."""

    def __init__(self, redis: Any, clock: Callable[[], datetime]) -> None:
        self._redis = redis
        self._clock = clock

    @redis_boundary
    async def count(self, team_id: int, key_id: int | None, status: int, reason: str) -> None:
        key = refusals_key(team_id, self._clock().date())
        pipe = self._redis.pipeline(transaction=False)
        pipe.hincrby(key, f"{status}:{reason[:64].replace(':', '_')}:{key_id or 0}", 1)
        pipe.expire(key, KEEP_DAYS * 86_400)
        await pipe.execute()

    @redis_boundary
    async def recent(self, team_id: int, key_id: int | None = None) -> list[RefusalCount]:
        """Today's and the last 7 UTC days' counts (today included), by status then reason; one
        key's only with `key_id`."""
        today = self._clock().date()
        pipe = self._redis.pipeline(transaction=False)
        for back in range(WINDOW_DAYS):
            pipe.hgetall(refusals_key(team_id, today - timedelta(days=back)))
        days: list[dict[bytes | str, bytes | str]] = await pipe.execute()
        return summarise(days, key_id)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def summarise(days: list[dict[bytes | str, bytes | str]], key_id: int | None = None) -> list[RefusalCount]:
    """`days[0]` is today; fields that do not parse are ignored."""
    week: dict[tuple[int, str], int] = {}
    today: dict[tuple[int, str], int] = {}
    for index, fields in enumerate(days):
        for field, value in fields.items():
            status, reason, key = [*_text(field).split(":"), "", ""][:3]
            if not (status.isdigit() and key.isdigit() and _text(value).lstrip("-").isdigit()):
                continue
            if key_id is not None and int(key) != key_id:
                continue
            pair = (int(status), reason)
            week[pair] = week.get(pair, 0) + int(_text(value))
            if index == 0:
                today[pair] = today.get(pair, 0) + int(_text(value))
    return [RefusalCount(s, r, today.get((s, r), 0), n) for (s, r), n in sorted(week.items())]
