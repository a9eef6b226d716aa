"""Filters: a node that fails any of them gets nothing for this request."""

from __future__ import annotations

from collections.abc import Callable

from apps.core.nodes.state import ROUTABLE
from apps.core.scheduling.view import NodeView, PickRequest

Filter = Callable[[PickRequest, NodeView], bool]


def serves_model(req: PickRequest, node: NodeView) -> bool:
    return req.model in node.models


def routable(req: PickRequest, node: NodeView) -> bool:
    """Drained, draining, stale, dead and revoked nodes get nothing."""
    return node.state in ROUTABLE


def not_excluded(req: PickRequest, node: NodeView) -> bool:
    """A retry never goes back to the node that just failed the request."""
    return node.node_id not in req.exclude


def has_free_seq(req: PickRequest, node: NodeView) -> bool:
    """In-flight below the node's `max_num_seqs` for the model (vLLM would queue the rest), less
    the slots a batch request leaves to interactive ones."""
    return node.in_flight < req.capacity(node.models.get(req.model, 0))


def kv_headroom(req: PickRequest, node: NodeView) -> bool:
    """A KV cache that is (nearly) full means preemptions and TTFT spikes: send work elsewhere."""
    return node.kv_cache_usage < req.kv_cache_max


def of_revision(req: PickRequest, node: NodeView) -> bool:
    """A canary split or a resume names the revisions the request may go to: a node serving another
    one (or not saying which) gets nothing."""
    return req.revisions is None or node.revisions.get(req.model) in req.revisions


DEFAULT_FILTERS: tuple[Filter, ...] = (
    serves_model,
    routable,
    not_excluded,
    of_revision,
    has_free_seq,
    kv_headroom,
)
