"""The picker: filters then (location, load, id) — table of fleets and the expected order."""

from __future__ import annotations

import pytest

from apps.core.nodes.state import NodeState
from apps.core.scheduling.picker import rank, serving_anywhere
from apps.core.scheduling.view import NodeView, PickRequest


def n(
    node_id: str,
    location: str = "cloud",
    in_flight: int = 0,
    state: NodeState = NodeState.READY,
    models: dict[str, int] | None = None,
    kv_cache_usage: float = 0.0,
) -> NodeView:
    return NodeView(
        node_id=node_id,
        location=location,
        models=models if models is not None else {"m": 4},
        state=state,
        in_flight=in_flight,
        kv_cache_usage=kv_cache_usage,
    )


@pytest.mark.parametrize(
    ("fleet", "exclude", "expected"),
    [
        ([], (), []),
        ([n("c1"), n("p1", "onprem")], (), ["p1", "c1"]),  # on-premises first
        ([n("p1", "onprem", in_flight=4), n("c1")], (), ["c1"]),  # a full on-prem node is skipped
        ([n("p1", "onprem", in_flight=3), n("p2", "onprem", in_flight=1), n("c1")], (), ["p2", "p1", "c1"]),
        ([n("c2", in_flight=2), n("c1", in_flight=1)], (), ["c1", "c2"]),  # least loaded first
        ([n("c1"), n("c2")], (), ["c1", "c2"]),  # deterministic tie-break by id
        ([n("p1", "onprem"), n("c1")], ("p1",), ["c1"]),  # a retry avoids the node that failed
        ([n("p1", "onprem", state=NodeState.DRAINING), n("c1", state=NodeState.STALE)], (), []),
        ([n("c1", kv_cache_usage=0.99), n("c2")], (), ["c2"]),
        ([n("c1", models={"other": 8})], (), []),
    ],
)
def test_rank(fleet: list[NodeView], exclude: tuple[str, ...], expected: list[str]) -> None:
    req = PickRequest("m", "r", frozenset(exclude))
    assert [v.node_id for v in rank(req, fleet)] == expected


def test_serving_anywhere_ignores_state_so_a_busy_model_is_not_reported_as_cold() -> None:
    assert serving_anywhere("m", [n("c1", in_flight=4, state=NodeState.DRAINING)])
    assert not serving_anywhere("big", [n("c1")])
