"""KEDA's cron trigger in simulated time: active from a `start` occurrence until the next `end`.

Five-field cron (minute hour day-of-month month day-of-week) with `*`, numbers, ranges and lists,
evaluated in the trigger's time zone. Polls move forward in time, so the window state is kept
incrementally (one minute checked per minute passed).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from apps.core.errors import SpecError

_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))


def _field(text: str, lo: int, hi: int) -> frozenset[int]:
    out: set[int] = set()
    for part in text.split(","):
        if part == "*":
            out.update(range(lo, hi + 1))
        elif "-" in part:
            a, b = part.split("-")
            out.update(range(int(a), int(b) + 1))
        else:
            out.add(int(part))
    return frozenset(out)


class Cron:
    def __init__(self, expr: str) -> None:
        parts = expr.split()
        if len(parts) != 5:
            raise SpecError(f"cron {expr!r}: want 5 fields", param="cron")
        self.fields = [_field(p, lo, hi) for p, (lo, hi) in zip(parts, _RANGES, strict=True)]

    def matches(self, d: datetime) -> bool:
        minute, hour, dom, month, dow = self.fields
        return (
            d.minute in minute
            and d.hour in hour
            and d.day in dom
            and d.month in month
            and (d.isoweekday() % 7) in dow
        )


class CronWindow:
    """`active(t)` for t (seconds after `epoch`) non-decreasing across calls."""

    def __init__(self, start: str, end: str, timezone: str, epoch: datetime) -> None:
        self.start, self.end = Cron(start), Cron(end)
        self.zone = ZoneInfo(timezone)
        self.epoch = epoch
        self.state = False
        # The state at t = 0: the latest of the two kinds of occurrence in the week before.
        begin = self._minute(0.0) - timedelta(days=8)
        self.cursor = begin
        self._advance(self._minute(0.0))

    def _minute(self, t: float) -> datetime:
        return (self.epoch + timedelta(seconds=t)).astimezone(self.zone).replace(second=0, microsecond=0)

    def _advance(self, until: datetime) -> None:
        while self.cursor < until:
            self.cursor += timedelta(minutes=1)
            local = self.cursor.astimezone(self.zone)
            if self.end.matches(local):
                self.state = False
            if self.start.matches(local):
                self.state = True

    def active(self, t: float) -> bool:
        self._advance(self._minute(t))
        return self.state
