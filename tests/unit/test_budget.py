"""`Budget` (apps/core/budget.py): the clamp, the resume's remainder and the hash fields."""

from __future__ import annotations

from apps.core.budget import Budget, Clamped, Usage


def test_clamp_caps_each_count_at_its_bound() -> None:
    budget = Budget(100, 20, 2)
    assert budget.max_tokens == 10
    assert budget.clamp(Usage(90, 20)) == Clamped(Usage(90, 20), False)
    assert budget.clamp(Usage(101, 5)) == Clamped(Usage(100, 5), True)
    assert budget.clamp(Usage(3, 21)) == Clamped(Usage(3, 20), True)
    assert budget.clamp(None) == Clamped(Usage(0, 0), False)
    assert Budget().clamp(Usage(10**9, 10**9)) == Clamped(Usage(10**9, 10**9), False)  # unbounded


def test_after_is_what_a_resumed_stream_may_still_generate() -> None:
    assert Budget(100, 20).after(5) == Budget(100, 15)
    assert Budget(100, 20).after(19) == Budget(100, 1)
    assert Budget(100, 20).after(20) is None
    assert Budget().after(5) == Budget()


def test_fields_round_trip() -> None:
    budget = Budget(100, 20, 2)
    assert budget.to_fields() == {"max_prompt": 100, "max_completion": 20, "n": 2}
    assert Budget.from_fields({k.encode(): str(v).encode() for k, v in budget.to_fields().items()}) == budget
    assert Budget().to_fields() == {}
    assert Budget.from_fields({}) == Budget()
    assert budget.total == 120
    assert Budget().total is None
