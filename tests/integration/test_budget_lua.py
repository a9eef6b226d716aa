"""The settle script's cap and `Budget.clamp` agree (apps/core/budget.py, apps/orchestrator/settle.py).

The Lua script must cap a node's report atomically, so the cap exists twice: in `Budget.clamp` and in
the script, which reads the fields `Budget.to_fields` wrote into the assignment hash (through the
slot script, `Fleet.acquire_slot`). A few hundred seeded random cases against real Redis: bounded
and unbounded budgets, reports under, at and over the bounds, zero, and missing usage."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from apps.core.budget import Budget, Usage
from apps.core.nodes import keys
from apps.core.nodes.state import NodeState
from apps.core.scheduling.view import NodeView
from apps.orchestrator.fleet import Fleet
from apps.orchestrator.settle_lua import RECORD_DONE_LUA

pytestmark = pytest.mark.timeout(60)

CASES = 300
NODE = NodeView(node_id="n1", location="onprem", models={"m": 10_000}, state=NodeState.READY)


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


def _budget(rng: random.Random) -> Budget:
    if rng.random() < 0.15:
        return Budget()  # an older gateway: no bound known
    n = rng.choice([1, 1, 2, 3])
    return Budget(rng.randint(0, 4000), n * rng.randint(1, 512), n)


def _count(rng: random.Random, bound: int | None) -> int | None:
    """A reported count: missing, zero, under, at or over the bound (an over-report)."""
    top = bound if bound is not None else 5000
    return rng.choice([None, 0, rng.randint(0, top), top, top + rng.randint(1, 10_000)])


async def test_the_settle_scripts_cap_is_budget_clamp(redis: Redis) -> None:
    rng = random.Random(28)
    fleet = Fleet(redis, heartbeat_interval_s=5, heartbeat_ttl_s=15, missed_heartbeats=3, max_request_s=600)
    record_done = redis.register_script(RECORD_DONE_LUA)
    await redis.hset(keys.node_hash(NODE.node_id), mapping={"conn": "c1", "orchestrator_id": "o1"})
    for i in range(CASES):
        request_id = f"r{i}"
        budget = _budget(rng)
        assert await fleet.acquire_slot(NODE, "m", request_id, "o1", budget=budget) == 1
        assert Budget.from_fields(await redis.hgetall(keys.request_key(request_id))) == budget
        prompt, completion = _count(rng, budget.prompt_tokens), _count(rng, budget.completion_tokens)
        record: dict[str, object] = {"node": NODE.node_id}
        if prompt is not None:
            record["prompt_tokens"] = prompt
        if completion is not None:
            record["completion_tokens"] = completion
        answer = await record_done(
            keys=[keys.request_key(request_id), keys.done_key(request_id), keys.node_inflight(NODE.node_id)],
            args=[NODE.node_id, json.dumps(record), 60, request_id, "0", "", 4, 8],
        )
        usage = None if prompt is None and completion is None else Usage(prompt or 0, completion or 0)
        expected = budget.clamp(usage)
        case = f"case {i}: {budget}, reported {prompt}/{completion}"
        assert int(answer[0]) == 1, case
        assert (int(answer[3]), int(answer[4])) == expected.usage, case
        assert bool(int(answer[2])) is expected.capped, case
        stored = json.loads(await redis.get(keys.done_key(request_id)) or b"{}")
        assert (stored["prompt_tokens"], stored["completion_tokens"]) == expected.usage, case
