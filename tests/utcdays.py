"""The UTC days a test's work can have been counted on.

Per-day counters (`tpd:<subject>:<YYYYMMDD>`, the usage rollups' days) are keyed by the UTC day
of the moment they are written. A test that reads "today" after its requests settled would fail
on a run that crosses midnight UTC; these helpers look at every day from the test's start to now.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from apps.core.metering import tpd_key


def utc_days(since: datetime, until: datetime | None = None) -> list[datetime]:
    """One instant on each UTC day from `since` to `until` (default: now), both included."""
    start = since.astimezone(UTC)
    end = (until or datetime.now(UTC)).astimezone(UTC)
    days: list[datetime] = []
    at = start
    while at.date() <= end.date():
        days.append(at)
        at += timedelta(days=1)
    return days


def day_labels(since: datetime, fmt: str = "%Y-%m-%d") -> set[str]:
    return {f"{day:{fmt}}" for day in utc_days(since)}


async def tokens_counted(redis: Any, subject: int | str, since: datetime) -> int:
    """The tokens settled against `subject`'s per-day counters since `since`, over every UTC day."""
    total = 0
    for day in utc_days(since):
        total += int(await redis.get(tpd_key(subject, day)) or 0)
    return total
