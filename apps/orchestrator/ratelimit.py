"""Registration token bucket with retry hints that spread a reconnect storm.

A refused node gets `retry_after_s` = its place in a virtual line behind the nodes
refused before it (each one 1/rate later), so a thousand nodes refused in the same
second come back spread over the following seconds instead of together. The agent adds
its own jitter on top.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    def __init__(
        self,
        rate_per_s: float,
        burst: int,
        *,
        max_hint_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rate = rate_per_s
        self._burst = float(burst)
        self._max_hint = max_hint_s
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()
        self._line_until = self._last

    def _refill(self, now: float) -> None:
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
        self._last = now

    def try_take(self) -> float | None:
        """None when admitted; otherwise the seconds the caller should wait before retrying."""
        now = self._clock()
        self._refill(now)
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return None
        first_free = now + (1.0 - self._tokens) / self._rate
        self._line_until = max(self._line_until, first_free) + 1.0 / self._rate
        return min(self._max_hint, self._line_until - now)
