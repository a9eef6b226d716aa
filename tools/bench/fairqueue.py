"""The fair queue's added cost per request against the FIFO queue it replaced, side by side.

    .venv/bin/python -m tools.bench fairqueue [--depths 200,1000] [--teams 10] [--rounds 5]

Method: in one process and one event loop, for each depth N: N requests (from `--teams` teams,
round-robin, equal weights, one class; the fair queue with its `TeamService` not synced, which
is what a dispatch pays — the sync is once per fleet refresh) join a model's queue while no slot
is free; then slots free one at a time (a slot freed, `notify`, the head takes it) until every
request is served. Reported: this process's user+system CPU per request (enqueue, wake-ups,
head choice, serve, leave), the median of `--rounds` alternating rounds (FIFO, fair, FIFO, ...).
The FIFO baseline is the queue as it was before issue 19 (a broadcast wakes every waiter; only
the head of arrival order picks), copied here verbatim in behaviour.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from apps.core.nodes.state import NodeState
from apps.orchestrator.queue import Queues, Share
from apps.orchestrator.scheduling.view import NodeView, PickRequest
from tools.bench.common import machine, self_cpu_seconds

NODE = NodeView(node_id="n1", location="cloud", models={"m": 8}, state=NodeState.READY)
TryPick = Callable[[PickRequest], Awaitable[NodeView | None]]


class FifoQueues:
    """The per-model FIFO queue before issue 19 (apps/orchestrator/queue.py at 1e21439)."""

    def __init__(self, try_pick: TryPick) -> None:
        self._try_pick = try_pick
        self.waiters: deque[object] = deque()
        self.changed = asyncio.Event()

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    async def acquire(self, req: PickRequest, timeout_s: float) -> NodeView:
        if not self.waiters:
            node = await self._try_pick(req)
            if node is not None:
                return node
        me = object()
        self.waiters.append(me)
        try:
            while True:
                if self.waiters[0] is me:
                    node = await self._try_pick(req)
                    if node is not None:
                        return node
                changed = self.changed
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), timeout_s)
        finally:
            self.waiters.remove(me)
            self.notify()


class Slots:
    def __init__(self) -> None:
        self.free = 0
        self.served = 0
        self.granted = asyncio.Event()

    async def try_pick(self, _req: PickRequest) -> NodeView | None:
        if self.free <= 0:
            return None
        self.free -= 1
        self.served += 1
        self.granted.set()
        return NODE


async def _round(kind: str, depth: int, teams: int) -> float:
    """CPU seconds per request for one queue kind at one depth."""
    slots = Slots()
    fifo = FifoQueues(slots.try_pick)
    fair = Queues(slots.try_pick, max_len=depth + 1, max_per_team=depth + 1)
    shares = [Share(team=t, cost=500.0) for t in range(teams)]
    await asyncio.sleep(0)
    cpu0 = self_cpu_seconds()
    tasks = []
    for i in range(depth):
        req = PickRequest("m", f"r{i}")
        if kind == "fifo":
            tasks.append(asyncio.create_task(fifo.acquire(req, 60.0)))
        else:
            tasks.append(asyncio.create_task(fair.acquire(req, 60.0, 5.0, shares[i % teams])))
    for _ in range(3):
        await asyncio.sleep(0)  # every request has joined the queue
    while slots.served < depth:
        slots.granted.clear()
        slots.free += 1
        if kind == "fifo":
            fifo.notify()
        else:
            fair.notify("m")
        await slots.granted.wait()
    await asyncio.gather(*tasks)
    return (self_cpu_seconds() - cpu0) / depth


async def _direct(kind: str, n: int, teams: int) -> float:
    """CPU seconds per request when nobody waits (a free slot each time): the common case."""
    slots = Slots()
    fifo = FifoQueues(slots.try_pick)
    fair = Queues(slots.try_pick, max_len=10)
    shares = [Share(team=t, cost=500.0) for t in range(teams)]
    cpu0 = self_cpu_seconds()
    for i in range(n):
        slots.free = 1
        req = PickRequest("m", f"r{i}")
        if kind == "fifo":
            await fifo.acquire(req, 60.0)
        else:
            await fair.acquire(req, 60.0, 5.0, shares[i % teams])
    return (self_cpu_seconds() - cpu0) / n


async def run(depths: Sequence[int], teams: int, rounds: int) -> None:
    info = machine()
    print(f"fairqueue: {teams} teams, {rounds} alternating rounds per depth; {info}")
    direct: dict[str, list[float]] = {"fifo": [], "fair": []}
    for _ in range(rounds):
        for kind in ("fifo", "fair"):
            direct[kind].append(await _direct(kind, 20_000, teams))
    fifo_us, fair_us = (statistics.median(direct[k]) * 1e6 for k in ("fifo", "fair"))
    print(
        f"  nobody waiting: FIFO {fifo_us:6.2f} µs CPU/request, fair {fair_us:6.2f} µs CPU/request, "
        f"added {fair_us - fifo_us:+6.2f} µs"
    )
    for depth in depths:
        results: dict[str, list[float]] = {"fifo": [], "fair": []}
        for _ in range(rounds):
            for kind in ("fifo", "fair"):
                results[kind].append(await _round(kind, depth, teams))
        fifo_us = statistics.median(results["fifo"]) * 1e6
        fair_us = statistics.median(results["fair"]) * 1e6
        print(
            f"  depth {depth:>5}: FIFO {fifo_us:8.1f} µs CPU/request, fair {fair_us:8.1f} µs CPU/request, "
            f"added {fair_us - fifo_us:+8.1f} µs"
        )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench fairqueue", description=__doc__)
    parser.add_argument("--depths", default="200,1000")
    parser.add_argument("--teams", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    asyncio.run(run([int(d) for d in args.depths.split(",")], args.teams, args.rounds))
    return 0
