"""The picker: filter, then order by (location rank, load, node id) — deterministic."""

from __future__ import annotations

from collections.abc import Iterable

from apps.core.scheduling.filters import DEFAULT_FILTERS, Filter
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
    return sorted(
        candidates(req, nodes, filters), key=lambda n: (location_rank(req, n), load(req, n), n.node_id)
    )


def serving_anywhere(model: str, nodes: Iterable[NodeView]) -> bool:
    """Whether any known node serves the model at all (else a 70B scale-from-zero wait)."""
    return any(model in n.models for n in nodes)
