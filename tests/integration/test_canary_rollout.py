"""Canary by model revision on a real replica (apps/orchestrator/canary.py) with its rollouts in
PostgreSQL (apps/core/rollouts.py): the split by conversation across nodes of two revisions, every
turn of a conversation on one revision, and the automatic rollback of a canary that breaks a bound."""

from __future__ import annotations

import json
from typing import Any

import pytest

from apps.core.errors import InvalidRequest, NotFound
from apps.core.protocol import node as proto
from apps.core.rollouts import RolloutStore
from apps.core.scheduling.canary import Sample, conversation_key, preferred
from apps.orchestrator.app import RunningOrchestrator
from tests.fakes.fake_node import Auto, FakeNode
from tests.integration.orchestrator_env import Env, eventually

pytestmark = pytest.mark.timeout(60)
MODEL = "m"


async def test_the_store_starts_changes_promotes_and_rolls_back_once(env: Env) -> None:
    store = RolloutStore(env.pool)
    with pytest.raises(InvalidRequest, match="no rollout yet"):
        await store.start(MODEL, "r2", 5, None, "alice")
    with pytest.raises(InvalidRequest, match="stable revision"):
        await store.start(MODEL, "r1", 5, "r1", "alice")
    with pytest.raises(InvalidRequest, match="percentage"):
        await store.start(MODEL, "r2", 101, "r1", "alice")
    with pytest.raises(InvalidRequest, match="revision"):
        await store.start(MODEL, "r 2", 5, "r1", "alice")
    assert await store.get(MODEL) is None  # nothing written by a refusal
    await store.start(MODEL, "r2", 5, "r1", "alice")
    rollout = await store.start(MODEL, "r2", 10, None, "alice")  # a new weight, the same canary
    assert (rollout.stable, rollout.canary, rollout.weight) == ("r1", "r2", 10.0)
    with pytest.raises(InvalidRequest, match="is live"):
        await store.start(MODEL, "r3", 5, None, "bob")
    assert not await store.rollback(MODEL, "r3", "bob", "not the live canary")
    assert await store.rollback(MODEL, "r2", "orch-1", "automatic: TTFT")
    assert not await store.rollback(MODEL, "r2", "orch-2", "automatic: TTFT")  # another replica: once
    assert await store.get(MODEL) == type(rollout)(MODEL, "r1")
    with pytest.raises(NotFound):
        await store.promote(MODEL, "alice")
    await store.start(MODEL, "r3", 50, None, "bob")
    assert await store.promote(MODEL, "bob") == type(rollout)(MODEL, "r3")
    actions = [(e.action, e.revision, e.actor) for e in await store.history(MODEL)]
    assert actions == [
        ("promote", "r3", "bob"),
        ("canary", "r3", "bob"),
        ("rollback", "r2", "orch-1"),
        ("canary", "r2", "alice"),
        ("canary", "r2", "alice"),
    ]


def _body(i: int, turns: int = 1) -> dict[str, Any]:
    messages: list[dict[str, str]] = [{"role": "user", "content": f"conversation {i}"}]
    for t in range(1, turns):
        messages += [{"role": "assistant", "content": f"a{t}"}, {"role": "user", "content": f"q{t}"}]
    return {"model": MODEL, "messages": messages, "stream": True}


async def _two_revisions(env: Env, **settings: Any) -> tuple[RunningOrchestrator, dict[str, FakeNode]]:
    orch = await env.orchestrator({"rollouts": RolloutStore(env.pool)}, canary_refresh_s=0.05, **settings)
    nodes = {}
    for node_id, revision in (("n-stable", "r1"), ("n-canary", "r2")):
        info = proto.ModelInfo(name=MODEL, max_num_seqs=64, max_model_len=4096, revision=revision)
        nodes[revision] = await env.node(orch, node_id, models=[info], auto=Auto(tokens=2))
    return orch, nodes


def _served(nodes: dict[str, FakeNode]) -> dict[str, str]:
    """request id -> the revision of the node it was assigned to."""
    return {f.request_id: rev for rev, n in nodes.items() for f in n.frames if isinstance(f, proto.Assign)}


async def test_conversations_split_by_weight_and_stay_on_their_revision(env: Env) -> None:
    store = RolloutStore(env.pool)
    rollout = await store.start(MODEL, "r2", 30, "r1", "alice")
    orch, nodes = await _two_revisions(env)
    await eventually(lambda: _live(orch))
    expected: dict[str, str] = {}
    for i in range(40):
        for turn in (1, 3):
            rid = f"c{i}-t{turn}"
            await env.ledger.add(rid)
            status, _, body = await env.dispatch(orch, rid, body=_body(i, turn))
            assert status == 200, body
            expected[rid] = preferred(rollout, conversation_key(_body(i), env.ledger.team_id, rid))
    assert _served(nodes) == expected  # each as its conversation's bucket says, both turns alike
    assert 0 < list(expected.values()).count("r2") < 40 * 2  # both revisions served some
    picks = orch.plane.metrics.canary_picks
    assert picks.labels(MODEL, "r2")._value.get() == list(expected.values()).count("r2")


async def _live(orch: RunningOrchestrator) -> bool:
    return MODEL in orch.plane.canaries.judges


async def test_a_canary_that_breaks_its_ttft_bound_is_rolled_back_and_gets_nothing_more(env: Env) -> None:
    store = RolloutStore(env.pool)
    await store.start(MODEL, "r2", 50, "r1", "alice")
    orch, nodes = await _two_revisions(env, canary_min_requests=5, canary_hold_s=0)
    await eventually(lambda: _live(orch))
    judge = orch.plane.canaries.judges[MODEL]
    now = orch.plane.deps.monotonic()
    for _ in range(5):  # what the replica's relays measured: the canary's first tokens 4x later
        judge.observe("r1", Sample(now, 0.05, 40.0, True))
        judge.observe("r2", Sample(now, 0.2, 40.0, True))

    async def rolled_back() -> bool:
        return await store.get(MODEL) == type(judge.rollout)(MODEL, "r1")

    await eventually(rolled_back)
    assert orch.plane.metrics.canary_rollbacks.labels(MODEL, "r2")._value.get() == 1
    last = (await store.history(MODEL))[0]
    assert (last.action, last.revision, last.actor) == ("rollback", "r2", orch.plane.id)
    assert last.reason is not None
    assert last.reason.startswith("automatic: TTFT p95")
    before = len(_served(nodes))
    for i in range(20):  # every conversation, whatever its bucket, now on the stable revision
        rid = f"after-{i}"
        await env.ledger.add(rid)
        status, _, body = await env.dispatch(orch, rid, body=_body(i))
        assert status == 200, json.loads(body)
    after = list(_served(nodes).items())[before:]
    assert {rev for _, rev in after} == {"r1"}
