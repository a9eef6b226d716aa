"""enginesim's `--scheduling-policy priority` (vLLM V1's): the waiting queue is ordered by
`(priority, arrival)`, the preemption victim is the highest `(priority, arrival)`; fcfs (the
default) refuses a non-zero `priority`, as vLLM does."""

from __future__ import annotations

from dataclasses import replace

import pytest

from apps.core.batching.scheduler import Scheduler, SeqState, Sequence
from apps.enginesim import chat
from apps.enginesim.engine import Engine
from apps.enginesim.metrics import EngineMetrics
from apps.enginesim.profiles import TINY


def _drain(sched: Scheduler) -> None:
    for _ in range(100_000):
        if not sched.has_work():
            return
        sched.step()
    raise AssertionError("the scheduler never finished")


def test_a_full_batch_admits_the_higher_priority_first() -> None:
    sched = Scheduler(replace(TINY, max_num_seqs=1), "priority")
    batch = [Sequence(f"b{i}", 20, 5, "length", arrival_s=0.0, priority=10) for i in range(4)]
    for seq in batch:
        sched.add(seq)
    sched.step()  # b0 runs (the batch is full); b1-b3 wait
    interactive = Sequence("i0", 20, 5, "length", arrival_s=1.0, priority=0)
    sched.add(interactive)
    assert [s.request_id for s in sched.waiting] == ["i0", "b1", "b2", "b3"]
    _drain(sched)
    assert interactive.first_scheduled_s is not None
    assert batch[1].first_scheduled_s is not None
    # The interactive request, later than b1-b3, went into the first free slot.
    assert interactive.first_scheduled_s < batch[1].first_scheduled_s


def test_fcfs_keeps_arrival_order() -> None:
    sched = Scheduler(replace(TINY, max_num_seqs=2))
    for i in range(4):
        sched.add(Sequence(f"b{i}", 20, 5, "length", arrival_s=0.0, priority=10))
    sched.step()
    sched.add(Sequence("i0", 20, 5, "length", arrival_s=1.0, priority=0))
    assert [s.request_id for s in sched.waiting] == ["b2", "b3", "i0"]


def _first_victim(policy: str) -> str:
    prof = replace(TINY, num_blocks=11, max_model_len=160)  # 10 usable blocks = 160 tokens
    sched = Scheduler(prof, policy)
    sched.add(Sequence("low", 30, 60, "length", arrival_s=0.0, priority=10))
    for i in range(2):
        sched.add(Sequence(f"high{i}", 30, 60, "length", arrival_s=1.0 + i, priority=0))
    for _ in range(10_000):
        result = sched.step()
        if result.preempted:
            return result.preempted[0]
    raise AssertionError("no preemption")


def test_kv_pressure_preempts_the_lowest_priority_not_the_last() -> None:
    assert _first_victim("fcfs") == "high1"  # the last running request
    assert _first_victim("priority") == "low"  # the highest (priority, arrival)


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown scheduling policy"):
        Scheduler(TINY, "lifo")


def test_a_non_zero_priority_is_accepted_whatever_the_policy_as_vllm() -> None:
    """vLLM 0.32 on an fcfs server answers 200 to a non-zero `priority` (measured 2026-12-07) and seats
    requests in arrival order (`test_fcfs_keeps_arrival_order`)."""
    body: dict[str, object] = {"messages": [{"role": "user", "content": "hi"}], "priority": 10}
    job = chat.plan_chat(body, served_model="tiny", max_model_len=1024, mean_answer_tokens=16, server_seed=0)
    assert job.priority == 10


def test_a_preemption_is_counted_when_the_victim_produces_again_as_vllm() -> None:
    """vLLM 0.32 counts `num_preemptions_total` from the PREEMPTED event carried by the request's
    next output (measured on the real engine: the counter moves when the victim resumes)."""
    prof = replace(TINY, num_blocks=11, max_model_len=160)
    metrics = EngineMetrics("tiny", prof.max_model_len, prof.num_blocks, prof.block_size)
    engine = Engine(prof, metrics, clock=lambda: 0.0, scheduling_policy="priority")
    engine.submit("low", 30, 60, "length", priority=10)
    engine.submit("high", 30, 60, "length", priority=0)
    sched, counter = engine.scheduler, metrics.preemptions
    seen_waiting = False
    for _ in range(10_000):
        if not sched.has_work():
            break
        result = sched.step()
        engine._deliver(result)
        low_waiting = "low" in sched.by_id and sched.by_id["low"].state is SeqState.WAITING
        if result.preempted or low_waiting:
            assert result.preempted in ([], ["low"])
            assert counter._value.get() == 0  # preempted, not scheduled again yet
            seen_waiting = True
        elif seen_waiting and any(t.request_id == "low" for t in result.tokens):
            assert counter._value.get() == 1
            break
    else:
        raise AssertionError("the scheduler never finished")
    assert seen_waiting, "no preemption"
    assert counter._value.get() == 1
