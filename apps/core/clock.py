"""Time, injected: one clock convention for every component whose behaviour depends on time.

`Clock` has the three readings the platform uses: `now()` (aware UTC datetime: quota windows,
ledger rows), `wall()` (epoch seconds: heartbeats and records shared between processes),
`monotonic()` (deadlines and rates inside one process), and `sleep`. Components take a `Clock`
(or one of its bound methods) in their constructor or deps with `SYSTEM` as the default; tests
pass a fake clock and never sleep.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Protocol


class MonotonicClock(Protocol):
    """What deadlines and pauses need (the agent's backoff, its engine wait)."""

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class Clock(MonotonicClock, Protocol):
    def now(self) -> datetime: ...

    def wall(self) -> float: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def wall(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


SYSTEM = SystemClock()
