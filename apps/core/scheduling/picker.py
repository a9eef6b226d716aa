"""The picker: filter, then order by (location rank, load less the prefix bonus, node id) —
deterministic. The prefix bonus (apps/core/scheduling/prefix.py) is zero without KV events."""

from __future__ import annotations

from collections.abc import Iterable

from apps.core.scheduling.filters import DEFAULT_FILTERS, Filter
from apps.core.scheduling.prefix import prefix_bonus
from apps.core.scheduling.scorers import load, location_rank
from apps.core.scheduling.view import NodeView, PickRequest


def candidates(
    req: PickRequest, nodes: Iterable[NodeView], filters: tuple[Filter, ...] = DEFAULT_FILTERS
) -> list[NodeView]:
    return [n for n in nodes if all(f(req, n) for f in filters)]


def rank(
    req: PickRequest, nodes: Iterable[NodeView], filters: tuple[Filter, ...] = DEFAULT_FILTERS
) -> list[NodeView]:
    """Nodes that may take the request, best first."""
    nodes = candidates(req, nodes, filters)
    loads = {n.node_id: load(req, n) for n in nodes}
    bonus: dict[str, float] = {}
    if req.prefix:  # the hot-spot guard compares a node with its own tier (on premises fill first)
        for tier in {location_rank(req, n) for n in nodes}:
            tier_loads = {n.node_id: loads[n.node_id] for n in nodes if location_rank(req, n) == tier}
            bonus |= prefix_bonus(req.prefix, tier_loads, req.prefix_weights)
    return sorted(
        nodes, key=lambda n: (location_rank(req, n), loads[n.node_id] - bonus.get(n.node_id, 0.0), n.node_id)
    )


def serving_anywhere(model: str, nodes: Iterable[NodeView]) -> bool:
    """Whether any known node serves the model at all (else a 70B scale-from-zero wait)."""
    return any(model in n.models for n in nodes)
