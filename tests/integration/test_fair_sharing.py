"""Fair sharing across two orchestrator replicas against real Redis: each replica's fair queue
decides locally from per-team service counters it syncs through Redis (as `ControlPlane.sync_shares`
does after every fleet refresh), over one node of capacity 8 shared by both.

The node is a stand-in for the fleet's slot counter (a slot freed wakes the replica that held it;
the other learns at its next sync, as with the real fleet refresh) and each request holds its slot
for a fixed engine time: the test measures queue waits on the real clock, which is what it proves.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from apps.core.nodes.state import NodeState
from apps.core.sharing import PriorityClass
from apps.orchestrator.fairshare import TeamService
from apps.orchestrator.queue import Queues, Share
from apps.orchestrator.scheduling.view import NodeView, PickRequest

MODEL = "m"
CAPACITY = 8
ENGINE_S = 0.02  # how long one request holds its slot
SYNC_S = 0.1  # the replicas' fleet refresh interval in this test
NODE = NodeView(node_id="n1", location="cloud", models={MODEL: CAPACITY}, state=NodeState.READY)


class Node:
    def __init__(self) -> None:
        self.free = CAPACITY
        self.served: list[tuple[int, float]] = []  # (team, tokens) in order of service

    def picker(self, team_of: dict[str, Share]) -> object:
        async def try_pick(req: PickRequest) -> NodeView | None:
            if self.free <= 0:
                return None
            self.free -= 1
            share = team_of[req.request_id]
            self.served.append((share.team, share.cost))
            return NODE

        return try_pick


class Replica:
    def __init__(self, name: str, node: Node, redis: aioredis.Redis) -> None:
        self.shares: dict[str, Share] = {}
        self.service = TeamService(name)
        self.queues = Queues(
            node.picker(self.shares),  # type: ignore[arg-type]
            max_len=2000,
            max_per_team=1000,
            service=self.service,
        )
        self.node = node
        self.redis = redis
        self.waits: dict[int, list[float]] = {}

    async def request(self, rid: str, share: Share) -> None:
        self.shares[rid] = share
        t0 = time.monotonic()
        await self.queues.acquire(PickRequest(MODEL, rid), 30.0, 5.0, share)
        self.waits.setdefault(share.team, []).append(time.monotonic() - t0)
        await asyncio.sleep(ENGINE_S)  # the engine working on it
        self.node.free += 1
        self.queues.notify(MODEL)

    async def sync_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.service.sync(self.redis, [MODEL], self.queues.lanes())
            self.queues.notify(MODEL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SYNC_S)


@pytest.fixture
async def replicas(redis_url: str) -> AsyncIterator[tuple[Replica, Replica]]:
    redis = aioredis.Redis.from_url(redis_url)
    node = Node()
    pair = (Replica("r1", node, redis), Replica("r2", node, redis))
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        for r in pair:
            tg.create_task(r.sync_loop(stop))
        yield pair
        stop.set()
    await redis.aclose()


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(0.95 * (len(ordered) - 1))]


@pytest.mark.timeout(60)
async def test_a_flood_does_not_make_a_spread_team_wait(replicas: tuple[Replica, Replica]) -> None:
    r1, r2 = replicas
    a, b = Share(team=1, cost=100), Share(team=2, cost=100)
    async with asyncio.TaskGroup() as tg:
        for i in range(400):  # team A: 400 at once, over both replicas
            tg.create_task((r1, r2)[i % 2].request(f"a{i}", a))
        for i in range(20):  # team B: 20 spread over the same seconds
            tg.create_task((r2, r1)[i % 2].request(f"b{i}", b))
            await asyncio.sleep(0.05)
    b_waits = r1.waits[2] + r2.waits[2]
    a_waits = r1.waits[1] + r2.waits[1]
    assert len(b_waits) == 20
    assert len(a_waits) == 400  # A is not starved: every request served, none refused
    assert p95(b_waits) < 2.0
    # With FIFO B would wait behind A's whole flood: 400 x 20 ms / 8 = 1 s for the last of A,
    # so B's waits must be well under A's.
    assert p95(b_waits) < p95(a_waits) / 2


@pytest.mark.timeout(60)
async def test_weights_two_to_one_share_served_tokens(replicas: tuple[Replica, Replica]) -> None:
    r1, r2 = replicas
    node = r1.node
    a, b = Share(team=1, weight=2.0, cost=100), Share(team=2, weight=1.0, cost=100)
    async with asyncio.TaskGroup() as tg:
        for i in range(300):  # both teams backlogged on both replicas
            tg.create_task((r1, r2)[i % 2].request(f"a{i}", a))
            tg.create_task((r2, r1)[i % 2].request(f"b{i}", b))
    # While both were backlogged (B's 300 run out after ~450 serves at 2:1), tokens split 2:1.
    window = node.served[CAPACITY : 400 + CAPACITY]
    tokens = Counter[int]()
    for team, cost in window:
        tokens[team] += int(cost)
    ratio = tokens[1] / tokens[2]
    assert ratio == pytest.approx(2.0, rel=0.10), tokens


@pytest.mark.timeout(60)
async def test_batch_yields_to_interactive_across_replicas(replicas: tuple[Replica, Replica]) -> None:
    r1, r2 = replicas
    batch, interactive = Share(team=1, klass=PriorityClass.BATCH), Share(team=2)
    async with asyncio.TaskGroup() as tg:
        for i in range(200):  # batch floods replica 1 only
            tg.create_task(r1.request(f"batch{i}", batch))
        # The batch backlog is established: the node is full and most of the flood waits on replica 1.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while r1.queues.depth(MODEL) < 100:
            assert loop.time() < deadline, "the batch flood never queued"
            await asyncio.sleep(0)  # one turn of the loop: the flood's tasks enqueue themselves
        for i in range(20):  # interactive arrives on replica 2 only
            tg.create_task(r2.request(f"int{i}", interactive))
    # Interactive requests waited at most about one sync interval plus a few engine steps each.
    assert p95(r2.waits[2]) < 1.0
    assert len(r1.waits[1]) == 200
