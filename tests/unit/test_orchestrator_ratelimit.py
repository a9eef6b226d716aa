"""Registration token bucket: burst, refill, and retry hints that spread refused nodes."""

from __future__ import annotations

import itertools

from apps.orchestrator.ratelimit import TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_burst_then_refusals_with_hints_one_interval_apart() -> None:
    clock = Clock()
    bucket = TokenBucket(10.0, 3, clock=clock)
    assert [bucket.try_take() for _ in range(3)] == [None, None, None]
    hints = [bucket.try_take() for _ in range(4)]
    assert all(h is not None for h in hints)
    gaps = [round(b - a, 6) for a, b in itertools.pairwise(hints)]  # type: ignore[operator]
    assert gaps == [0.1, 0.1, 0.1]  # 10/s: each refused node gets its own slot in line


def test_refill_admits_at_the_configured_rate_and_never_beyond_burst() -> None:
    clock = Clock()
    bucket = TokenBucket(2.0, 2, clock=clock)
    assert bucket.try_take() is None
    assert bucket.try_take() is None
    assert bucket.try_take() is not None
    clock.now += 0.5  # one token at 2/s
    assert bucket.try_take() is None
    assert bucket.try_take() is not None
    clock.now += 3600
    assert [bucket.try_take() for _ in range(3)][:2] == [None, None]


def test_hints_are_capped() -> None:
    clock = Clock()
    bucket = TokenBucket(1.0, 1, max_hint_s=5.0, clock=clock)
    bucket.try_take()
    hints = [bucket.try_take() for _ in range(20)]
    assert max(h for h in hints if h is not None) == 5.0
