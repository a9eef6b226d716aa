"""Reconnect backoff: exponential with FULL jitter, reset only after a `register_ack`.

Delay of attempt n (0-based) is `uniform(0, min(cap, base * 2**n))`, the "full jitter"
of the AWS architecture blog: after an orchestrator restart N nodes spread evenly over
the whole window instead of arriving in synchronized waves. A refusal's
`retry_after_s` is a floor: the node waits `retry_after_s + uniform(0, window)`, so
refused nodes do not all come back in the same second either.

The clock (`apps.core.clock`) and the random source (`RandomSource`) are injected so the schedule
is tested without sleeping.
"""

from __future__ import annotations

import random
from typing import Protocol


class RandomSource(Protocol):
    def random(self) -> float:
        """A float in [0, 1)."""
        ...


def system_random() -> RandomSource:
    return random.SystemRandom()


class Backoff:
    def __init__(self, rng: RandomSource, base_s: float = 1.0, cap_s: float = 60.0) -> None:
        if base_s <= 0 or cap_s < base_s:
            raise ValueError("need 0 < base_s <= cap_s")
        self._rng = rng
        self._base = base_s
        self._cap = cap_s
        self._attempt = 0

    @property
    def attempt(self) -> int:
        return self._attempt

    def window(self) -> float:
        """Upper bound of the next delay (before jitter)."""
        # min() before the power would overflow for a long outage; the exponent is capped instead.
        exponent = min(self._attempt, 62)
        return min(self._cap, self._base * float(2**exponent))

    def next_delay(self, retry_after_s: float | None = None) -> float:
        delay = self._rng.random() * self.window()
        if retry_after_s is not None and retry_after_s > 0:
            delay += retry_after_s
        self._attempt += 1
        return delay

    def reset(self) -> None:
        """Only after the orchestrator answered `register_ack` (tailscale's rule: a TCP
        connect or a WebSocket upgrade alone proves nothing about the server's health)."""
        self._attempt = 0
