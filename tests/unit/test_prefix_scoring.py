"""Prefix affinity in the picker (apps/core/scheduling/prefix.py, picker.py): conversation keys that
a longer conversation shares, and a bonus that never outweighs location nor lets one node run hot."""

from __future__ import annotations

from apps.core.nodes.state import NodeState
from apps.core.scheduling.picker import rank
from apps.core.scheduling.prefix import (
    PrefixWeights,
    chat_messages,
    lookup_keys,
    prefix_bonus,
    prefix_keys,
    prefix_outcome,
)
from apps.core.scheduling.view import NodeView, PickRequest

SYSTEM = {"role": "system", "content": "You are the payer's claims assistant."}
TURN1 = [SYSTEM, {"role": "user", "content": "Is claim 12 covered?"}]
TURN2 = [*TURN1, {"role": "assistant", "content": "Yes."}, {"role": "user", "content": "And 13?"}]


def _node(node_id: str, in_flight: int = 0, location: str = "onprem") -> NodeView:
    return NodeView(node_id, location, {"m": 8}, NodeState.READY, in_flight=in_flight)


def test_a_later_turn_shares_the_keys_of_every_earlier_prefix() -> None:
    first, second = prefix_keys(TURN1), prefix_keys(TURN2)
    assert second[: len(first)] == first  # the first turn's prompt is the second's prefix
    assert len(set(second)) == len(second)
    assert prefix_keys([{"role": "system", "content": "other"}])[0] != first[0]
    assert lookup_keys(TURN2)[0] == second[-1]  # longest first
    assert prefix_keys([{**SYSTEM, "refusal": None}]) == prefix_keys([SYSTEM])  # a null field is no field
    assert prefix_keys([{**SYSTEM, "name": "ops"}]) != prefix_keys([SYSTEM])  # every field renders
    tools = [{"type": "function", "function": {"name": "lookup_claim"}}]
    assert prefix_keys(TURN1, tools)[0] != first[0]  # the template renders the tools first


def test_chat_messages_ignores_what_is_not_a_chat() -> None:
    assert chat_messages({"prompt": "x"}) == []
    assert chat_messages({"messages": [SYSTEM, "junk"]}) == [SYSTEM]


def test_the_node_holding_the_prefix_is_picked_unless_it_runs_hot() -> None:
    nodes = [_node("a", in_flight=2), _node("b", in_flight=1)]
    plain = PickRequest("m")
    assert [n.node_id for n in rank(plain, nodes)] == ["b", "a"]  # least loaded
    affine = PickRequest("m", prefix={"a": 10})
    assert [n.node_id for n in rank(affine, nodes)] == ["a", "b"]  # 1/8 load behind, 0.5 bonus
    hot = [_node("a", in_flight=6), _node("b", in_flight=1)]  # 5/8 ahead: past the 0.5 margin
    assert [n.node_id for n in rank(affine, hot)] == ["b", "a"]
    off = PickRequest("m", prefix={"a": 10}, prefix_weights=PrefixWeights(weight=0.0))
    assert [n.node_id for n in rank(off, nodes)] == ["b", "a"]


def test_location_still_comes_first() -> None:
    nodes = [_node("cloud-1", location="cloud"), _node("prem-1", in_flight=3)]
    req = PickRequest("m", prefix={"cloud-1": 20})
    assert rank(req, nodes)[0].node_id == "prem-1"  # on premises first, as before


def test_the_bonus_scales_with_the_share_of_the_best_match() -> None:
    loads = {"a": 0.0, "b": 0.0, "c": 0.0}
    bonus = prefix_bonus({"a": 8, "b": 2}, loads, PrefixWeights(weight=0.5, hot_margin=0.5))
    assert bonus == {"a": 0.5, "b": 0.125}
    assert prefix_bonus({}, loads, PrefixWeights()) == {}


def test_the_outcome_of_a_pick_for_the_hit_rate() -> None:
    assert prefix_outcome({"a": 3}, "a") == "hit"
    assert prefix_outcome({"a": 3}, "b") == "miss"
    assert prefix_outcome({}, "b") == "none"
