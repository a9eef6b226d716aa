"""Table tests of each scheduling filter and scorer (pure functions)."""

from __future__ import annotations

import pytest

from apps.core.nodes.state import NodeState
from apps.core.scheduling import filters, scorers
from apps.core.scheduling.view import NodeView, PickRequest


def node(**kw: object) -> NodeView:
    base: dict[str, object] = {
        "node_id": "n",
        "location": "cloud",
        "models": {"m": 4},
        "state": NodeState.READY,
    }
    return NodeView(**{**base, **kw})  # type: ignore[arg-type]


REQ = PickRequest("m", "r", frozenset({"tried"}), kv_cache_max=0.9)


@pytest.mark.parametrize(
    ("flt", "view", "expected"),
    [
        (filters.serves_model, node(), True),
        (filters.serves_model, node(models={"other": 4}), False),
        (filters.routable, node(state=NodeState.READY), True),
        (filters.routable, node(state=NodeState.DRAINING), False),
        (filters.routable, node(state=NodeState.STALE), False),
        (filters.routable, node(state=NodeState.DEAD), False),
        (filters.routable, node(state=NodeState.REVOKED), False),
        (filters.not_excluded, node(node_id="fresh"), True),
        (filters.not_excluded, node(node_id="tried"), False),
        (filters.has_free_seq, node(in_flight=3), True),
        (filters.has_free_seq, node(in_flight=4), False),
        (filters.has_free_seq, node(models={"other": 4}), False),
        (filters.kv_headroom, node(kv_cache_usage=0.89), True),
        (filters.kv_headroom, node(kv_cache_usage=0.9), False),
    ],
)
def test_filter(flt: filters.Filter, view: NodeView, expected: bool) -> None:
    assert flt(REQ, view) is expected


@pytest.mark.parametrize(
    ("location", "rank"),
    [("onprem", 0.0), ("cloud", 1.0), ("elsewhere", 2.0)],
)
def test_location_rank_prefers_onprem(location: str, rank: float) -> None:
    assert scorers.location_rank(REQ, node(location=location)) == rank


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (node(in_flight=1), node(in_flight=2)),  # fewer slots used
        (node(in_flight=1, kv_cache_usage=0.1), node(in_flight=1, kv_cache_usage=0.5)),  # tie broken by KV
        (node(in_flight=1, queue_depth=0), node(in_flight=1, queue_depth=3)),  # then by the engine's queue
        (node(in_flight=2, models={"m": 16}), node(in_flight=2, models={"m": 4})),  # relative to capacity
    ],
)
def test_load_orders_less_loaded_first(a: NodeView, b: NodeView) -> None:
    assert scorers.load(REQ, a) < scorers.load(REQ, b)


@pytest.mark.parametrize(
    ("seqs", "in_flight", "reserve", "expected"),
    [
        (8, 6, 0.125, True),
        (8, 7, 0.125, False),  # batch leaves the last of 8 slots to interactive
        (8, 7, 0.0, True),  # interactive may take it
        (64, 55, 0.125, True),
        (64, 56, 0.125, False),  # 8 of 64 reserved
        (1, 0, 0.125, True),  # a one-slot node still takes one batch request
    ],
)
def test_batch_leaves_a_share_of_each_nodes_slots(
    seqs: int, in_flight: int, reserve: float, expected: bool
) -> None:
    req = PickRequest("m", "r", reserve_fraction=reserve)
    assert filters.has_free_seq(req, node(models={"m": seqs}, in_flight=in_flight)) is expected
