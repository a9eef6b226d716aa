"""Node states (docs/architecture.md, convention 6) and the pure function that derives them.

The live state of a node is derived, never stored: from its token (revoked or not), the
Redis heartbeat hash `node:{id}` (present or expired, its age, its `draining` flag) and
the heartbeat interval. Transitions:

    (no heartbeat yet / key expired / socket closed) ............ DEAD
    DEAD     --register_ack--------------------------------------> READY
    READY    --drain frame sent, or heartbeat says draining------> DRAINING
    READY    --heartbeat older than 2 intervals------------------> STALE
    DRAINING --heartbeat older than 2 intervals------------------> STALE
    STALE    --heartbeat arrives---------------------------------> READY / DRAINING
    any      --key expired (15 s) or socket closed---------------> DEAD
    any      --token revoked---------------------------------------> REVOKED (socket closed
                                                                  within one heartbeat interval)
    REVOKED  --new token issued and node registers---------------> READY

Only READY nodes receive assignments; DRAINING nodes finish what they have; STALE, DEAD
and REVOKED nodes get nothing and the owner cancels their in-flight requests.
"""

from __future__ import annotations

import enum


class NodeState(enum.StrEnum):
    READY = "ready"
    DRAINING = "draining"
    STALE = "stale"
    DEAD = "dead"
    REVOKED = "revoked"


ROUTABLE = frozenset({NodeState.READY})


def derive_state(
    *,
    revoked: bool,
    heartbeat_present: bool,
    heartbeat_age_s: float | None,
    draining: bool,
    heartbeat_interval_s: float,
    missed_heartbeats: int = 2,
) -> NodeState:
    """The node's state from what the stores say (pure; table-tested)."""
    if revoked:
        return NodeState.REVOKED
    if not heartbeat_present or heartbeat_age_s is None:
        return NodeState.DEAD
    if heartbeat_age_s > missed_heartbeats * heartbeat_interval_s:
        return NodeState.STALE
    if draining:
        return NodeState.DRAINING
    return NodeState.READY
