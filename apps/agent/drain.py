"""Drain bookkeeping: when it was asked for, by whom, and its (only shrinking) deadline.

A `drain` frame brings its own `deadline_s`; SIGTERM uses `--drain-timeout`; a second
SIGTERM shrinks the deadline to 0, which wakes a running wait at once.
"""

from __future__ import annotations

import asyncio
import contextlib

from apps.core.aio import first_of


class DrainControl:
    def __init__(self, default_deadline_s: float) -> None:
        self.requested = asyncio.Event()
        self.deadline_s = default_deadline_s
        self.reason = "drain"
        self._shorten = asyncio.Event()

    def request(self, deadline_s: float | None, reason: str) -> bool:
        """True when this call started the drain; later calls can only shorten it."""
        if self.requested.is_set():
            if deadline_s is not None and deadline_s < self.deadline_s:
                self.deadline_s = deadline_s
                self._shorten.set()
            return False
        if deadline_s is not None:
            self.deadline_s = deadline_s
        self.reason = reason
        self.requested.set()
        return True

    async def wait_idle(self, idle: asyncio.Event) -> bool:
        """Wait for `idle` until the deadline (counted from now); True if it came."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        while not idle.is_set():
            remaining = started + self.deadline_s - loop.time()
            if remaining <= 0:
                break
            await first_of(idle.wait(), self._shorten.wait(), limit_s=remaining)
            self._shorten.clear()
        return idle.is_set()


async def wait_for(event: asyncio.Event, timeout_s: float) -> bool:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
    return event.is_set()
