"""Time windows of the ops commands: `--from/--to` instants and ISO weeks (`2026-W49`), UTC."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable

from apps.ops.promapi import OpsError

UTC = dt.UTC


def parse_instant(
    text: str, param: str, now: Callable[[], dt.datetime] = lambda: dt.datetime.now(UTC)
) -> dt.datetime:
    """`now`, `today` / `yesterday` (UTC midnight), `-24h` / `-90m` (before now), or ISO 8601."""
    current = now()
    midnight = current.replace(hour=0, minute=0, second=0, microsecond=0)
    named = {"now": current, "today": midnight, "yesterday": midnight - dt.timedelta(days=1)}
    if text in named:
        return named[text]
    relative = re.fullmatch(r"-(\d+)([smhd])", text)
    if relative:
        unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[relative.group(2)]
        return current - dt.timedelta(**{unit: int(relative.group(1))})
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise OpsError(
            f"--{param}: {text!r} is not a time (ISO 8601, now, today, yesterday, -24h)", param=param
        ) from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def window(start: str, end: str) -> tuple[dt.datetime, dt.datetime]:
    lo, hi = parse_instant(start, "from"), parse_instant(end, "to")
    if lo >= hi:
        raise OpsError(
            f"empty window: --from {lo.isoformat()} is not before --to {hi.isoformat()}", param="from"
        )
    return lo, hi


def iso_week(text: str) -> tuple[dt.datetime, dt.datetime]:
    match = re.fullmatch(r"(\d{4})-W(\d{2})", text)
    if not match:
        raise OpsError(f"--week: {text!r} is not an ISO week like 2026-W49", param="week")
    try:
        monday = dt.datetime.fromisocalendar(int(match.group(1)), int(match.group(2)), 1)
    except ValueError:
        raise OpsError(f"--week: {text!r} has no such week", param="week") from None
    start = monday.replace(tzinfo=UTC)
    return start, start + dt.timedelta(days=7)
