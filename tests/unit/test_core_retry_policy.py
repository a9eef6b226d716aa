"""The retry policy the orchestrator's relay and `llmfleet simulate` share (apps.core.scheduling.retry)."""

from __future__ import annotations

import pytest

from apps.core.scheduling.retry import MAX_ATTEMPTS, MAX_UNREACHABLE, RetryBudget, queue_budget

pytestmark = pytest.mark.timeout(10)


def test_one_retry_after_a_failed_attempt_then_none() -> None:
    budget = RetryBudget()
    assert budget.left()
    budget.spend(reached=True)
    assert budget.left()  # the retry on another node
    budget.spend(reached=True)
    assert not budget.left()
    assert MAX_ATTEMPTS == 2


def test_unreachable_nodes_do_not_use_attempts_up_to_the_cap() -> None:
    budget = RetryBudget()
    for _ in range(MAX_UNREACHABLE):
        budget.spend(reached=False)
    assert budget.attempts == 0
    budget.spend(reached=False)  # past the cap: counted
    budget.spend(reached=False)
    assert not budget.left()


def test_queue_budget_is_what_is_left_and_a_retry_gets_at_least_a_second() -> None:
    assert queue_budget(30.0, 12.0, retrying=False) == 18.0
    assert queue_budget(30.0, 29.5, retrying=True) == 1.0
    assert queue_budget(30.0, 31.0, retrying=False) == -1.0
