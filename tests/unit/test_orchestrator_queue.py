"""Per-model queue basics: direct pick, FIFO within a team, 429 when full, 503 + Retry-After on timeout
(the fair-sharing rules are in test_orchestrator_fair_queue.py)."""

from __future__ import annotations

import asyncio

import pytest

from apps.core.errors import RateLimited, Unavailable
from apps.orchestrator.queue import Queues
from apps.orchestrator.scheduling.view import PickRequest
from tests.fakes.fake_slots import NODE, Slots


async def test_direct_pick_when_nobody_waits() -> None:
    slots = Slots(1)
    queues = Queues(slots.try_pick, max_len=10)
    assert await queues.acquire(PickRequest("m", "r1"), 1.0, 5.0) is NODE
    assert queues.depth("m") == 0


async def test_waiters_are_served_in_arrival_order() -> None:
    slots = Slots(0)
    queues = Queues(slots.try_pick, max_len=10)
    tasks = []
    for i in range(3):
        tasks.append(asyncio.create_task(queues.acquire(PickRequest("m", f"r{i}"), 30.0, 5.0)))
        while queues.depth("m") < i + 1:
            await asyncio.sleep(0)
    for _ in range(3):
        slots.free += 1
        queues.notify("m")
        while len(slots.served) < 3 - queues.depth("m"):
            await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert slots.served == ["r0", "r1", "r2"]


async def test_full_queue_is_429_with_retry_after() -> None:
    slots = Slots(0)
    queues = Queues(slots.try_pick, max_len=1)
    waiting = asyncio.create_task(queues.acquire(PickRequest("m", "r0"), 30.0, 5.0))
    while queues.depth("m") < 1:
        await asyncio.sleep(0)
    with pytest.raises(RateLimited) as err:
        await queues.acquire(PickRequest("m", "r1"), 30.0, 7.0)
    assert err.value.code == "queue_full"
    assert err.value.retry_after == 7.0
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert queues.depth("m") == 0  # a cancelled waiter leaves the queue


async def test_timeout_is_503_with_retry_after_and_observed() -> None:
    seen: list[tuple[str, str]] = []
    queues = Queues(
        Slots(0).try_pick, max_len=5, on_wait=lambda m, _s, _w, outcome: seen.append((m, outcome))
    )
    with pytest.raises(Unavailable) as err:
        await queues.acquire(PickRequest("m", "r0"), 0.05, 30.0)
    assert err.value.status == 503
    assert err.value.retry_after == 30.0
    assert seen == [("m", "timeout")]
    assert queues.depth("m") == 0


async def test_close_sends_every_waiter_and_later_request_away_but_not_a_continuation() -> None:
    """A stopping replica (`Queues.close`): its waiters leave at once with the refusal (the relay
    sends them to another replica), so does a new request; a resuming stream still waits here."""
    seen: list[str] = []
    slots = Slots(0)
    queues = Queues(slots.try_pick, max_len=10, on_wait=lambda _m, _s, _w, outcome: seen.append(outcome))
    waiting = [asyncio.create_task(queues.acquire(PickRequest("m", f"r{i}"), 30.0, 5.0)) for i in range(3)]
    while queues.depth("m") < 3:
        await asyncio.sleep(0)
    queues.close(lambda: Unavailable("stopping", code="orchestrator_stopping"))
    for task in waiting:
        with pytest.raises(Unavailable) as err:
            await asyncio.wait_for(task, 5)
        assert err.value.code == "orchestrator_stopping"
    assert queues.depth("m") == 0
    assert seen == ["closed"] * 3
    with pytest.raises(Unavailable):
        await queues.acquire(PickRequest("m", "r3"), 30.0, 5.0)
    resuming = asyncio.create_task(queues.acquire(PickRequest("m", "r4"), 30.0, 5.0, continuation=True))
    while queues.depth("m") < 1:
        await asyncio.sleep(0)
    slots.free += 1
    queues.notify("m")
    assert await asyncio.wait_for(resuming, 5) is NODE
    assert slots.served == ["r4"]
