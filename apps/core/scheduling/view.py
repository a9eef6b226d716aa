"""What the scheduler sees of one node and of one pick request (immutable values)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from apps.core.budget import UNBOUNDED, Budget
from apps.core.nodes.state import NodeState
from apps.core.scheduling.prefix import PrefixWeights


@dataclass(frozen=True)
class NodeView:
    node_id: str
    location: str  # onprem | cloud
    models: Mapping[str, int]  # model -> max_num_seqs on this node
    state: NodeState
    in_flight: int = 0  # requests assigned by every replica (cross-replica counter)
    kv_cache_usage: float = 0.0
    queue_depth: int = 0  # the engine's waiting requests
    owner: str = ""  # replica holding the node's socket
    conn: str = ""  # that socket's id (a new registration is a new socket)
    revisions: Mapping[str, str] = field(default_factory=dict)  # model -> the revision its engine serves

    def with_in_flight(self, delta: int) -> NodeView:
        return replace(self, in_flight=max(0, self.in_flight + delta))


@dataclass(frozen=True)
class PickRequest:
    model: str
    request_id: str = ""
    exclude: frozenset[str] = field(default_factory=frozenset)  # nodes already tried for this request
    kv_cache_max: float = 0.95
    # The tokens the request may use at most (apps/core/budget.py); recorded with the assignment.
    budget: Budget = UNBOUNDED
    # The stream may resume on another node after output started: the first node's mid-stream
    # error is then settled by the relay (or the second node), not by itself (`apps/orchestrator/resume.py`).
    resumable: bool = False
    # The share of each node's slots this request may not take (batch leaves it to interactive).
    reserve_fraction: float = 0.0
    # Prefix affinity (apps/core/scheduling/prefix.py): node id -> blocks of the request's prompt its
    # engine holds, and how much that may outweigh load.
    prefix: Mapping[str, int] = field(default_factory=dict)
    prefix_weights: PrefixWeights = field(default_factory=PrefixWeights)
    # The model revisions the request may go to (apps/core/scheduling/canary.py); None: any.
    revisions: frozenset[str] | None = None

    def capacity(self, max_num_seqs: int) -> int:
        """How many of a node's `max_num_seqs` slots this request may fill (at least one)."""
        if self.reserve_fraction <= 0:
            return max_num_seqs
        return max(1, max_num_seqs - math.ceil(max_num_seqs * self.reserve_fraction))
