"""Issue 27, node trust: a property over random interleavings of node frames (a real orchestrator,
PostgreSQL ledger and Redis; scripted WebSocket nodes with real node tokens).

Two honest nodes and a hostile one serve six streaming requests (one slot each: three run, three
queue; a mid-stream engine error resumes a stream on another node). At each step a random node
sends a random frame: the honest ones chunks and truthful (or slightly high) reports for their own
requests; the hostile one `done`/`error` frames with a marker prompt count (61) and up to a million
completion tokens for any request (queued, running elsewhere, resumed, its own) and chunks for any
request. Whatever the interleaving (the seed reproduces it):

* a request no node was assigned is never settled;
* a row settled with the hostile node's marker was assigned to the hostile node;
* no row settles more completion tokens than the nodes assigned to it relayed, within the stated
  tolerance (`UsageTolerance.bound` of each node's events, summed).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

from apps.core.protocol.dispatch import DISPATCH_PATH, DispatchRequest
from apps.orchestrator.app import SETTLER
from apps.orchestrator.tolerance import UsageTolerance
from tests.fakes.fake_node import FakeNode, vllm_chunk
from tests.integration.test_node_frames_trust import scripted_node, trust_nodes
from tests.integration.test_node_trust import MODEL, TOKEN, Trust

MARKER = 61  # the hostile node's prompt count (honest nodes report 5)
REQUESTS = 6
STEPS = 60


async def stream(env: Trust, request_id: str) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 40}
    dreq = DispatchRequest(
        request_id=request_id,
        team_id=env.team_id,
        model=MODEL,
        body=body,
        max_prompt_tokens=64,
        max_completion_tokens=40,
    )
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    async with env.session.post(
        env.orch.url + DISPATCH_PATH, data=dreq.model_dump_json(), headers=headers
    ) as r:
        await r.read()
        return r.status


class World:
    """What the test knows: who was assigned what, and what each node relayed for it."""

    def __init__(self, nodes: list[FakeNode]) -> None:
        self.nodes = nodes
        self.assigned: dict[str, set[str]] = defaultdict(set)
        self.open: dict[str, list[str]] = {n.node_id: [] for n in nodes}
        self.events: dict[tuple[str, str], int] = defaultdict(int)

    async def next_assignment(self, node: FakeNode, timeout: float) -> None:
        """Wait (at most `timeout`) for the node's next assignment: the node has nothing to do."""
        with contextlib.suppress(TimeoutError):
            assign = await asyncio.wait_for(node.assigns.get(), timeout)
            self.assigned[assign.request_id].add(node.node_id)
            self.open[node.node_id].append(assign.request_id)

    def take_assignments(self) -> None:
        for node in self.nodes:
            while not node.assigns.empty():
                rid = node.assigns.get_nowait().request_id
                self.assigned[rid].add(node.node_id)
                self.open[node.node_id].append(rid)

    async def chunk(self, node: FakeNode, rid: str) -> None:
        # Counted whoever the request belongs to: the bound only sums the nodes it was assigned
        # (an assignment may reach the node after the test picked the request as a foreign one).
        await node.chunk(rid, vllm_chunk(rid, MODEL, "w"))
        self.events[node.node_id, rid] += 1

    def close(self, node: FakeNode, rid: str) -> None:
        if rid in self.open[node.node_id]:
            self.open[node.node_id].remove(rid)


async def honest_step(world: World, node: FakeNode, rng: random.Random) -> None:
    if not world.open[node.node_id]:
        return
    rid = rng.choice(world.open[node.node_id])
    sent = world.events[node.node_id, rid]
    roll = rng.random()
    if roll < 0.6 or sent == 0:
        await world.chunk(node, rid)
    elif roll < 0.85:
        world.close(node, rid)
        await node.done(rid, 5, sent + rng.randint(0, 3), finish_reason="stop")
    else:  # an engine failure mid-stream: the stream resumes on another node
        world.close(node, rid)
        await node.error(rid, 500, "engine died", chunks_sent=sent, prompt_tokens=5, completion_tokens=sent)


async def hostile_step(world: World, node: FakeNode, rng: random.Random, rids: list[str]) -> None:
    own = world.open[node.node_id]
    foreign = [r for r in rids if node.node_id not in world.assigned[r]]
    rid = rng.choice(foreign if foreign and (rng.random() < 0.6 or not own) else own or rids)
    completion = rng.choice([0, 40, 200, 1_000_000, rng.randint(0, 1_000)])
    roll = rng.random()
    if roll < 0.3:
        await world.chunk(node, rid)
    elif roll < 0.7:
        world.close(node, rid)
        await node.done(rid, MARKER, completion, finish_reason="stop")
    else:
        world.close(node, rid)
        await node.error(
            rid, 500, "x", chunks_sent=rng.randint(1, 9), prompt_tokens=MARKER, completion_tokens=completion
        )


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
async def test_node_frames_never_touch_rows_their_node_was_not_assigned(
    migrated_db_url: str, redis_url: str, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    tolerance = UsageTolerance()
    async with trust_nodes(migrated_db_url, redis_url, tmp_path, queue_limit_s=30.0) as env:
        tag = uuid.uuid4().hex[:4]
        honest = [await scripted_node(env, f"honest-{i}-{tag}") for i in range(2)]
        hostile = await scripted_node(env, f"hostile-{tag}")
        world = World([*honest, hostile])
        rids = [await env.reserve(64, 40) for _ in range(REQUESTS)]
        tasks = [asyncio.create_task(stream(env, rid)) for rid in rids]
        for node in world.nodes:  # three run, three queue
            await world.next_assignment(node, 10)
        for _ in range(STEPS):
            world.take_assignments()
            node = rng.choice(world.nodes)
            if node is not hostile and not world.open[node.node_id] and not all(t.done() for t in tasks):
                await world.next_assignment(node, 0.3)
            if node is hostile:
                await hostile_step(world, node, rng, rids)
            else:
                await honest_step(world, node, rng)
        # Every node finishes what it holds, truthfully, until every stream ended.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while not all(t.done() for t in tasks):
            assert loop.time() < deadline, "streams did not end"
            world.take_assignments()
            for node in world.nodes:
                for rid in list(world.open[node.node_id]):
                    world.close(node, rid)
                    prompt = MARKER if node is hostile else 5
                    await node.done(rid, prompt, world.events[node.node_id, rid], finish_reason="stop")
            await asyncio.wait(tasks, timeout=0.1)
        world.take_assignments()
        settler = env.orch.app[SETTLER]
        await asyncio.wait_for(settler.idle.wait(), 10)
        for rid in rids:
            row = await env.row(rid)
            assert row is not None
            nodes = world.assigned[rid]
            context = f"seed {seed}: {rid} assigned to {sorted(nodes)}, row {row}"
            if not nodes:
                assert row.status != "settled", context
                continue
            if row.status != "settled":
                continue
            if row.prompt_tokens == MARKER:
                assert hostile.node_id in nodes, context
            relayed = sum(tolerance.bound(world.events[n, rid]) for n in nodes)
            assert row.completion_tokens <= relayed, context
