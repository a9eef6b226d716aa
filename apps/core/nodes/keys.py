"""Redis key and channel names of the node control plane (one place, shared by every replica).

- `node:{id}`            HASH of the last heartbeat, TTL 15 s; `orchestrator_id` = owner replica,
                         `conn` = id of the owning WebSocket connection (fences a superseded socket).
- `node:{id}:inflight`   ZSET of request ids assigned to the node, score = expiry (unix s); the
                         cross-replica capacity counter (`ZCARD` < max_num_seqs, taken atomically).
- `nodes:index`          ZSET node id -> last heartbeat time, so a replica lists live nodes without SCAN.
- `nodes:revoked`        SET of revoked node ids (checked atomically with every heartbeat write).
- `nodes:quarantined`    SET of node ids taken out of routing for reporting usage beyond a
                         request's worst case (cleared for a node when its token is re-issued).
- `nodech:{id}`          pub/sub channel of the replica that owns node `id` (assign, cancel, drain, revoke).
- `orch:{replica}`       pub/sub channel of one orchestrator replica (frames relayed back to it).
                         Pub/sub channels are server-wide, not per logical DB: a non-empty channel
                         namespace (`LLMFLEET_CHANNEL_NAMESPACE`, the same in every gateway and
                         replica of a platform) prefixes both, `{namespace}:nodech:{id}`, so that
                         platforms (or test runs) sharing one Redis server in different DBs never
                         hear each other. Empty (the default): the names above.
- `req:{request_id}`     HASH of the current assignment (node, origin replica, attempt, and the usage
                         bound `max_prompt`/`max_completion` the settle caps a report at), TTL max request time.
- `done:{request_id}`    the usage a node reported (JSON), kept for the sweeper; TTL 24 h.
- `partial:{request_id}` content events relayed before a node vanished (JSON), for the sweeper.
- `orch:sweeper`         lock so one replica sweeps at a time.
- `pfx:{model}:{key}`    HASH node id -> blocks of the conversation prefix `key` (apps/core/scheduling/
                         prefix.py) the node's engine holds; written by the node's owner replica while
                         its KV events say so, read by every replica's picker; TTL 1 h.
- `pfxnode:{id}`         SET of the `{model}:{key}` a node is announced under (to retract them all).
"""

from __future__ import annotations

# What a channel namespace may be (settings validate it): no `:` so that a channel's kind stays readable.
NAMESPACE_PATTERN = r"^[A-Za-z0-9_.-]{0,64}$"

NODES_INDEX = "nodes:index"
NODES_REVOKED = "nodes:revoked"
NODES_QUARANTINED = "nodes:quarantined"
SWEEPER_LOCK = "orch:sweeper"


def node_hash(node_id: str) -> str:
    return f"node:{node_id}"


def node_inflight(node_id: str) -> str:
    return f"node:{node_id}:inflight"


def _channel_prefix(namespace: str) -> str:
    return f"{namespace}:" if namespace else ""


def node_channel(node_id: str, *, namespace: str) -> str:
    return f"{_channel_prefix(namespace)}nodech:{node_id}"


def node_channel_prefix(namespace: str) -> str:
    """What every node channel of `namespace` starts with (the node id follows)."""
    return node_channel("", namespace=namespace)


def replica_channel(orchestrator_id: str, *, namespace: str) -> str:
    return f"{_channel_prefix(namespace)}orch:{orchestrator_id}"


def request_key(request_id: str) -> str:
    return f"req:{request_id}"


def done_key(request_id: str) -> str:
    return f"done:{request_id}"


def coldstart_key(model: str) -> str:
    """The wall time a replica of `model` that is starting from zero should be ready (apps/orchestrator/coldstart.py)."""
    return f"coldstart:{model}"


def partial_key(request_id: str) -> str:
    return f"partial:{request_id}"


def prefix_key(model: str, key: str) -> str:
    return f"pfx:{model}:{key}"


def prefix_node(node_id: str) -> str:
    return f"pfxnode:{node_id}"
