"""Cold starts answer at once (issue 15 section 2): a real orchestrator, real Redis, a fake wall clock.

No node serves the model and nothing will start it → 503 `model_unavailable` at once; a replica
is starting (scale from zero) and will not be ready within the queue limit → 503 `model_loading`
with `Retry-After` from the model's expected load time; ready within the limit, or a node of the
model seen lately → the request queues as before. Each refusal cancels the reservation.
"""

from __future__ import annotations

import asyncio
import json
import time

from prometheus_client.parser import text_string_to_metric_families

from apps.core.ledger.api import ReservationStatus
from apps.core.nodes import keys
from apps.core.protocol import node as proto
from apps.orchestrator.app import RunningOrchestrator
from tests.fakes.fake_node import Auto
from tests.integration.orchestrator_env import Env

LOAD_S = 95.0  # the cold model's expected load time (stack: weights / cache bandwidth + engine start)
QUEUE_LIMIT_S = 30.0


class FakeWallClock:
    def __init__(self) -> None:
        self.now = time.time()  # starts at the real time: node heartbeats are stamped with it

    def __call__(self) -> float:
        return self.now


async def _cold_orchestrator(env: Env, clock: FakeWallClock, *, scale_from_zero: bool) -> RunningOrchestrator:
    return await env.orchestrator(
        {"wall_clock": clock, "load_time_s": {"big": LOAD_S}},
        scale_from_zero=scale_from_zero,
        queue_limit_s=QUEUE_LIMIT_S,
        cold_start_grace_s=30.0,
    )


def _error(body: bytes) -> dict[str, str]:
    error: dict[str, str] = json.loads(body)["error"]
    return error


async def _pending_gauge(env: Env, orch: RunningOrchestrator, model: str) -> float:
    async with env.session.get(orch.url + "/metrics") as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "llmfleet_orchestrator_cold_start_pending" and sample.labels["model"] == model:
                return sample.value
    raise AssertionError("no cold-start gauge for " + model)


async def test_nothing_serves_and_nothing_starts_503_at_once(env: Env) -> None:
    clock = FakeWallClock()
    orch = await _cold_orchestrator(env, clock, scale_from_zero=False)
    clock.now += 31  # past the replica's start-up grace: it would have seen a node by now
    await env.ledger.add("r1")
    async with asyncio.timeout(QUEUE_LIMIT_S / 2):  # at once, not after the queue limit
        status, headers, body = await env.dispatch(orch, "r1", model="big")
    assert status == 503
    error = _error(body)
    assert (error["code"], error["type"]) == ("model_unavailable", "service_unavailable")
    assert "none is starting" in error["message"]
    assert headers["Retry-After"] == "30"
    assert float(headers["x-llmfleet-queue-wait"]) == 0.0  # it never queued
    assert await env.ledger.status("r1") is ReservationStatus.CANCELLED
    assert await env.redis.get(keys.coldstart_key("big")) is None  # nothing was asked to start


async def test_a_young_replica_or_a_model_seen_lately_queues_as_before(env: Env) -> None:
    clock = FakeWallClock()
    orch = await _cold_orchestrator(env, clock, scale_from_zero=False)
    await env.ledger.add("r1")
    # Within the grace after start: the nodes may still be reconnecting: it waits its queue limit.
    status, _, body = await env.dispatch(orch, "r1", model="big", deadlines={"queue_wait_s": 0.3})
    assert (status, _error(body)["code"]) == (503, "queue_timeout")
    # A node of the model comes and goes: for the grace after, requests queue (it may be back).
    big = [proto.ModelInfo(name="big", max_num_seqs=2, max_model_len=4096)]
    node = await env.node(orch, "n-big", models=big, auto=Auto())
    await env.ledger.add("r2")
    status, _, _ = await env.dispatch(orch, "r2", model="big")
    assert status == 200
    await node.close()
    clock.now += 29
    await env.ledger.add("r3")
    status, _, body = await env.dispatch(orch, "r3", model="big", deadlines={"queue_wait_s": 0.3})
    assert (status, _error(body)["code"]) == (503, "queue_timeout")


async def test_a_model_loading_from_zero_answers_with_its_load_time(env: Env) -> None:
    clock = FakeWallClock()
    orch = await _cold_orchestrator(env, clock, scale_from_zero=True)
    clock.now += 31
    start = clock.now
    await env.ledger.add("r1")
    async with asyncio.timeout(QUEUE_LIMIT_S / 2):
        status, headers, body = await env.dispatch(orch, "r1", model="big")
    assert status == 503
    error = _error(body)
    assert error["code"] == "model_loading"
    assert "is loading" in error["message"]
    assert headers["Retry-After"] == str(int(LOAD_S))
    assert await env.ledger.status("r1") is ReservationStatus.CANCELLED
    # The start is recorded for every replica, and the demand shows for KEDA on this one.
    assert float(await env.redis.get(keys.coldstart_key("big"))) == start + LOAD_S
    assert 0 < await env.redis.ttl(keys.coldstart_key("big")) <= LOAD_S + 60
    assert await _pending_gauge(env, orch, "big") == 1.0

    # Later requests get the same start's remaining time (not a new start).
    clock.now += 50
    await env.ledger.add("r2")
    status, headers, body = await env.dispatch(orch, "r2", model="big")
    assert (status, _error(body)["code"], headers["Retry-After"]) == (503, "model_loading", "45")

    # Ready within the queue limit: waiting helps, the request queues and is served by the new node.
    clock.now += 30  # 15 s left
    await env.ledger.add("r3")
    waiting = asyncio.create_task(env.dispatch(orch, "r3", model="big"))
    big = [proto.ModelInfo(name="big", max_num_seqs=2, max_model_len=4096)]
    await env.node(orch, "n-big", models=big, auto=Auto())
    status, _, _ = await asyncio.wait_for(waiting, 20)
    assert status == 200
    # A node serves it now: the start is no longer pending here.
    await env.ledger.add("r4")
    status, _, _ = await env.dispatch(orch, "r4", model="big")
    assert status == 200
    assert await _pending_gauge(env, orch, "big") == 0.0


async def test_another_replica_answers_with_the_same_start(env: Env) -> None:
    clock = FakeWallClock()
    first = await _cold_orchestrator(env, clock, scale_from_zero=True)
    second = await _cold_orchestrator(env, clock, scale_from_zero=True)
    clock.now += 31
    await env.ledger.add("r1")
    await env.ledger.add("r2")
    _, one, _ = await env.dispatch(first, "r1", model="big")
    clock.now += 10
    _, two, _ = await env.dispatch(second, "r2", model="big")
    assert (one["Retry-After"], two["Retry-After"]) == ("95", "85")
