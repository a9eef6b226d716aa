"""Scorers: lower sorts first. On-premises nodes are already paid for, so they fill first."""

from __future__ import annotations

from apps.core.scheduling.view import NodeView, PickRequest

LOCATION_RANK = {"onprem": 0, "cloud": 1}


def location_rank(req: PickRequest, node: NodeView) -> float:
    return float(LOCATION_RANK.get(node.location, 2))


def load(req: PickRequest, node: NodeView) -> float:
    """Fraction of sequence slots in use, plus KV use and the engine's own waiting queue.

    The slot fraction dominates; KV use and waiting requests break ties between nodes
    with equal slot use (they see load from outside this platform's counter, e.g. long
    prompts)."""
    seqs = max(1, node.models.get(req.model, 1))
    return node.in_flight / seqs + 0.5 * node.kv_cache_usage + 0.1 * node.queue_depth / seqs
