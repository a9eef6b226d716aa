"""When the gateway overlaps the ledger reservation with the Redis admission."""

from __future__ import annotations

import pytest

from apps.core.quota.admission import Admission, Limits, Verdict
from apps.gateway.speculation import Speculation, headroom

pytestmark = pytest.mark.timeout(10)


def answer(
    limits: Limits, *, verdict: Verdict = Verdict.ADMITTED, active: int = 0, used: int = 0, tokens: int = 0
) -> Admission:
    return Admission(verdict, limits, active, 0.0, used, 60.0, tokens, 3600.0)


def test_headroom_is_the_tightest_limit() -> None:
    limits = Limits(max_streams=10, rpm=100, tokens_per_day=1000)
    assert headroom(answer(limits, active=4, used=20)) == 6
    assert headroom(answer(limits, active=1, used=97)) == 3
    assert headroom(answer(limits, active=1, used=1, tokens=1000)) == 0
    assert headroom(answer(limits, verdict=Verdict.RPM, active=1, used=100)) == 0
    assert headroom(answer(Limits(tokens_per_day=5), tokens=1)) > 1000


def test_a_key_without_limits_always_overlaps() -> None:
    spec = Speculation()
    assert all(spec.begin("k", Limits()) for _ in range(1000))
    assert spec.in_flight("k") == 0  # nothing to bound: Redis can refuse it only when Redis is down


def test_a_limited_key_runs_in_order_until_redis_has_answered_once() -> None:
    spec, limits = Speculation(), Limits(max_streams=5)
    assert not spec.begin("k", limits)
    spec.record("k", answer(limits, active=1))
    assert spec.begin("k", limits)


def test_overlapped_requests_in_flight_never_exceed_the_headroom() -> None:
    spec, limits = Speculation(), Limits(max_streams=5)
    spec.record("k", answer(limits, active=2))  # 3 slots left
    began = [spec.begin("k", limits) for _ in range(10)]
    assert began == [True] * 3 + [False] * 7
    spec.end("k", limits)
    assert spec.begin("k", limits)
    assert not spec.begin("k", limits)


def test_a_refusal_or_a_full_key_stops_overlap() -> None:
    spec, limits = Speculation(), Limits(max_streams=5, rpm=10)
    spec.record("k", answer(limits, active=1, used=1))
    assert spec.begin("k", limits)
    spec.end("k", limits)
    spec.record("k", answer(limits, verdict=Verdict.MAX_STREAMS, active=5, used=1))
    assert not spec.begin("k", limits)
    spec.record("k", answer(limits, active=5, used=3))
    assert not spec.begin("k", limits)


def test_memory_is_bounded_and_forgets_least_recently_answered_keys() -> None:
    spec, limits = Speculation(max_keys=3), Limits(rpm=10)
    for name in "abcd":
        spec.record(name, answer(limits, used=1))
    assert not spec.begin("a", limits)  # evicted: back to in order
    assert spec.begin("d", limits)
    spec.end("gone", limits)  # ending for a forgotten key is harmless
