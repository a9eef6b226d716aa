"""The weighted fair queue: least weighted service first (in tokens), FIFO within a team, backlog
floors, batch only behind interactive (here and on other replicas), per-team refusals with a
Retry-After from the team's position and the measured drain rate."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from apps.core.errors import RateLimited
from apps.core.sharing import PriorityClass
from apps.orchestrator.fairshare import TeamService
from apps.orchestrator.queue import Queues, Share
from apps.orchestrator.scheduling.view import NodeView, PickRequest
from tests.fakes.fake_slots import NODE, Slots

BATCH = PriorityClass.BATCH


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def _until(cond: object, limit: int = 10_000) -> None:
    for _ in range(limit):
        if callable(cond) and cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


async def _enqueue(queues: Queues, rid: str, share: Share, timeout: float = 30.0) -> asyncio.Task[NodeView]:
    before = queues.depth("m")
    task = asyncio.create_task(queues.acquire(PickRequest("m", rid), timeout, 5.0, share))
    await _until(lambda: queues.depth("m") == before + 1)
    return task


async def _serve_one(queues: Queues, slots: Slots) -> None:
    n = len(slots.served)
    slots.free += 1
    queues.notify("m")
    await _until(lambda: len(slots.served) == n + 1)


async def test_least_weighted_service_first_fifo_within_team() -> None:
    slots = Slots()
    queues = Queues(slots.try_pick, max_len=100)
    tasks = [await _enqueue(queues, f"a{i}", Share(team=1, cost=100)) for i in range(4)]
    tasks += [await _enqueue(queues, f"b{i}", Share(team=2, cost=100)) for i in range(2)]
    for _ in range(6):
        await _serve_one(queues, slots)
    await asyncio.gather(*tasks)
    # A flooded first, B arrived behind it: B is served as soon as it is behind in service.
    assert slots.served == ["a0", "b0", "a1", "b1", "a2", "a3"]


async def test_service_is_counted_in_tokens_not_requests() -> None:
    slots = Slots()
    queues = Queues(slots.try_pick, max_len=100)
    tasks = [await _enqueue(queues, f"long{i}", Share(team=1, cost=1000)) for i in range(2)]
    tasks += [await _enqueue(queues, f"short{i}", Share(team=2, cost=100)) for i in range(5)]
    for _ in range(7):
        await _serve_one(queues, slots)
    await asyncio.gather(*tasks)
    # One 1000-token request of team 1 buys team 2 five 100-token requests before the second.
    assert slots.served[:2] == ["long0", "short0"]
    assert slots.served.index("long1") > slots.served.index("short4") - 1


async def test_weights_share_service_two_to_one() -> None:
    slots = Slots()
    queues = Queues(slots.try_pick, max_len=1000, max_per_team=1000)
    tasks = [await _enqueue(queues, f"a{i}", Share(team=1, weight=2.0, cost=10)) for i in range(90)]
    tasks += [await _enqueue(queues, f"b{i}", Share(team=2, weight=1.0, cost=10)) for i in range(90)]
    for _ in range(90):
        await _serve_one(queues, slots)
    served = Counter(rid[0] for rid in slots.served)
    assert served["a"] == 60
    assert served["b"] == 30
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert queues.depth("m") == 0


async def test_a_lane_starts_at_the_queues_virtual_time() -> None:
    """A team served a lot while the others were idle is not starved when they come back: the
    newcomers start at the virtual time, not 10,000 tokens behind (no burst of catch-up service)."""
    slots = Slots(free=1)
    service = TeamService()
    service.charge("m", 1, 10_000)  # team 1 was served alone earlier; team 2 never
    queues = Queues(slots.try_pick, max_len=100, service=service)
    await queues.acquire(PickRequest("m", "a-direct"), 1.0, 5.0, Share(team=1, cost=10))
    tasks = [await _enqueue(queues, f"b{i}", Share(team=2, cost=10)) for i in range(3)]
    tasks += [await _enqueue(queues, f"a{i}", Share(team=1, cost=10)) for i in range(3)]
    for _ in range(6):
        await _serve_one(queues, slots)
    await asyncio.gather(*tasks)
    # Team 2 starts level (10,000) with team 1 one request (10 tokens) ahead: ties go to the
    # earlier arrival.
    assert slots.served == ["a-direct", "b0", "b1", "a0", "b2", "a1", "a2"]


async def test_batch_waits_while_interactive_waits() -> None:
    slots = Slots()
    queues = Queues(slots.try_pick, max_len=100)
    tasks = [await _enqueue(queues, f"batch{i}", Share(team=1, klass=BATCH)) for i in range(2)]
    tasks += [await _enqueue(queues, f"int{i}", Share(team=2)) for i in range(2)]
    for _ in range(4):
        await _serve_one(queues, slots)
    await asyncio.gather(*tasks)
    assert slots.served == ["int0", "int1", "batch0", "batch1"]


async def test_batch_is_held_while_interactive_waits_on_another_replica() -> None:
    slots = Slots(free=1)
    service = TeamService("r1")
    service._interactive_elsewhere["m"] = 3  # as a sync would have read it
    queues = Queues(slots.try_pick, max_len=100, service=service)
    task = await _enqueue(queues, "batch0", Share(team=1, klass=BATCH))
    queues.notify("m")
    await asyncio.sleep(0)
    assert slots.served == []  # a free slot, but interactive work waits elsewhere
    service._interactive_elsewhere["m"] = 0
    queues.notify("m")
    assert await asyncio.wait_for(task, 5) is NODE


async def test_a_teams_flood_is_refused_before_it_fills_the_queue() -> None:
    slots = Slots()
    queues = Queues(slots.try_pick, max_len=100, max_per_team=3)
    tasks = [await _enqueue(queues, f"a{i}", Share(team=1)) for i in range(3)]
    with pytest.raises(RateLimited) as err:
        await queues.acquire(PickRequest("m", "a3"), 30.0, 7.0, Share(team=1))
    assert err.value.code == "team_queue_full"
    assert err.value.retry_after == 7.0  # no drain rate measured yet: the caller's hint
    tasks.append(await _enqueue(queues, "b0", Share(team=2)))  # another team still gets in
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_retry_after_and_refusal_follow_the_teams_position_and_drain_rate() -> None:
    clock = Clock()
    slots = Slots()
    queues = Queues(slots.try_pick, max_len=1000, max_per_team=1000, monotonic=clock)
    tasks = [await _enqueue(queues, f"a{i}", Share(team=1), timeout=1e9) for i in range(30)]
    for _ in range(10):  # 10 serves, one every 0.5 s: a drain of 2 requests/s
        clock.t += 0.5
        await _serve_one(queues, slots)
    rate = queues.drain_rate("m")
    assert rate is not None
    assert rate == pytest.approx(2.0)
    # Team 2 alone in its lane beside team 1: half the drain, its first waiter ~1 s away.
    tasks.append(await _enqueue(queues, "b0", Share(team=2), timeout=1e9))
    # Team 1's 21st waiter is at 21 / (2 x 1/2) = 21 s: past a 20 s wait limit -> 429 at once.
    with pytest.raises(RateLimited) as err:
        await queues.acquire(PickRequest("m", "late"), 20.0, 99.0, Share(team=1))
    assert err.value.code == "team_queue_full"
    assert err.value.retry_after == 21.0
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
