"""Canary by model revision without I/O (apps/core/scheduling/canary.py): the split by conversation,
the revisions a request may go to, the filter, and the judge's bounds."""

from __future__ import annotations

import pytest

from apps.core.nodes.state import NodeState
from apps.core.scheduling.canary import (
    BUCKETS,
    Bounds,
    CanaryJudge,
    Rollout,
    Sample,
    Stats,
    allowed,
    breach,
    bucket,
    conversation_key,
    preferred,
    same_revision,
)
from apps.core.scheduling.picker import rank
from apps.core.scheduling.view import NodeView, PickRequest

pytestmark = pytest.mark.timeout(30)
ROLLOUT = Rollout("m", stable="r1", canary="r2", weight=10.0)


def _conversation(i: int, turns: int = 1) -> dict[str, object]:
    messages: list[dict[str, str]] = [{"role": "system", "content": "be brief"}]
    messages.append({"role": "user", "content": f"question {i}"})
    for t in range(1, turns):
        messages += [
            {"role": "assistant", "content": f"answer {t}"},
            {"role": "user", "content": f"more {t}"},
        ]
    return {"model": "m", "messages": messages}


def test_every_turn_of_a_conversation_goes_to_the_same_revision() -> None:
    for i in range(200):
        first = preferred(ROLLOUT, conversation_key(_conversation(i), 7, f"req-{i}-a"))
        later = preferred(ROLLOUT, conversation_key(_conversation(i, turns=4), 7, f"req-{i}-b"))
        assert first == later


def test_the_key_is_the_teams_and_the_system_prompt_alone_does_not_decide() -> None:
    body = _conversation(1)
    assert conversation_key(body, 1, "x") != conversation_key(body, 2, "x")  # another team's
    same_system = [conversation_key(_conversation(i), 1, "x") for i in range(50)]
    assert len(set(same_system)) == 50  # a shared system prompt does not put all on one revision
    no_user = {"messages": [{"role": "system", "content": "s"}]}
    assert conversation_key(no_user, 1, "a") != conversation_key(no_user, 1, "b")  # by request then


@pytest.mark.parametrize("weight", [0.0, 5.0, 10.0, 50.0, 100.0])
def test_the_canary_takes_its_weight_of_the_conversations(weight: float) -> None:
    rollout = Rollout("m", "r1", "r2", weight)
    n = 20_000
    to_canary = sum(preferred(rollout, conversation_key(_conversation(i), 3, "")) == "r2" for i in range(n))
    if weight in (0.0, 100.0):
        assert to_canary == n * weight / 100
    else:  # a hash: binomial spread, 5 standard deviations
        sd = (n * weight / 100 * (1 - weight / 100)) ** 0.5
        assert abs(to_canary - n * weight / 100) < 5 * sd
    assert all(0 <= bucket(str(i).encode()) < BUCKETS for i in range(100))


def test_the_revisions_a_request_may_go_to() -> None:
    key = next(
        conversation_key(_conversation(i), 1, "")
        for i in range(1000)
        if preferred(ROLLOUT, conversation_key(_conversation(i), 1, "")) == "r2"
    )
    assert allowed(None, key, ["r1"]) is None  # no rollout: any revision
    assert allowed(ROLLOUT, key, ["r1", "r2"]) == {"r2"}
    assert allowed(ROLLOUT, key, ["r1"]) == {"r1"}  # no canary node: the stable one
    assert allowed(ROLLOUT, key, []) == {"r1"}  # nothing serves: wait for the stable
    assert allowed(ROLLOUT, key, ["r3"]) == {"r1"}  # never a revision not live
    rolled_back = Rollout("m", "r1")
    assert allowed(rolled_back, key, ["r1", "r2"]) == {"r1"}
    assert same_revision("r2") == {"r2"}
    assert same_revision(None) is None


def _node(node_id: str, revision: str | None) -> NodeView:
    revisions = {"m": revision} if revision is not None else {}
    return NodeView(node_id, "onprem", {"m": 4}, NodeState.READY, revisions=revisions)


def test_the_filter_keeps_a_request_on_its_revisions() -> None:
    nodes = [_node("a", "r1"), _node("b", "r2"), _node("c", None)]
    assert [n.node_id for n in rank(PickRequest("m"), nodes)] == ["a", "b", "c"]
    assert [n.node_id for n in rank(PickRequest("m", revisions=frozenset({"r2"})), nodes)] == ["b"]
    assert [n.node_id for n in rank(PickRequest("m", revisions=frozenset({"r1"})), nodes)] == ["a"]


def _samples(n: int, at: float, ttft: float, tps: float, ok: bool = True) -> list[Sample]:
    return [Sample(at, ttft if ok else None, tps if ok else None, ok) for _ in range(n)]


def test_each_bound_and_too_few_requests() -> None:
    bounds = Bounds(min_requests=10)
    stable = Stats.of(_samples(20, 0, 0.1, 50.0))
    assert breach(Stats.of(_samples(20, 0, 0.12, 45.0)), stable, bounds) is None
    assert "TTFT" in (breach(Stats.of(_samples(20, 0, 0.2, 50.0)), stable, bounds) or "")
    assert "tokens/s" in (breach(Stats.of(_samples(20, 0, 0.1, 20.0)), stable, bounds) or "")
    failing = _samples(18, 0, 0.1, 50.0) + _samples(2, 0, 0, 0, ok=False)
    assert "error" in (breach(Stats.of(failing), stable, bounds) or "")
    assert breach(Stats.of(_samples(9, 0, 9.0, 1.0)), stable, bounds) is None  # too few to judge


def test_a_breach_rolls_back_only_once_held_and_the_window_forgets() -> None:
    judge = CanaryJudge(ROLLOUT, Bounds(min_requests=5, hold_s=30, window_s=100))
    for s in _samples(10, 0, 0.1, 50.0):
        judge.observe("r1", s)
    for s in _samples(10, 0, 0.5, 50.0):
        judge.observe("r2", s)
    judge.observe("r9", Sample(0, 99, 1, True))  # another revision's: not counted
    assert judge.verdict(0) is None  # the breach starts now
    assert judge.reason is not None
    assert "TTFT" in judge.reason
    assert judge.verdict(29) is None
    assert judge.verdict(30) is not None  # held 30 s
    assert judge.verdict(101) is None  # out of the window: too few samples, the breach is over
    assert judge.reason is None
