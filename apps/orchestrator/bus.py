"""Cross-replica forwarding over Redis pub/sub, keyed by node id.

The replica holding a node's socket subscribes to `nodech:{node_id}`; any replica that
picked that node publishes `assign` / `cancel` there, and PUBLISH's receiver count tells
it at once whether anyone owns the node now (0 -> retry elsewhere, nothing was sent).
Frames for a forwarded request go back on the origin replica's own channel
`orch:{replica}`, published in the order the node sent them (one reader task per node,
sequential awaits). Both names carry the platform's channel namespace (`apps.core.nodes.keys`:
pub/sub is server-wide, not per Redis DB). The node channel follows the node when it
reconnects to another replica, so a forwarder never needs to know who owns the node. Lost
pub/sub messages (a replica restarting) are caught by the relay's first-token and idle
deadlines and by the fleet view noticing the owner's heartbeats stopped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from pydantic import ValidationError
from redis.asyncio import Redis
from redis.exceptions import RedisError

from apps.core.nodes import keys
from apps.core.protocol import bus as msgs
from apps.orchestrator.logs import event

NodeHandler = Callable[[str, msgs.NodeMessage], None]
ReplicaHandler = Callable[[str, msgs.ReplicaMessage], None]


class Bus:
    def __init__(
        self,
        redis: Redis,
        orchestrator_id: str,
        on_node: NodeHandler,
        on_replica: ReplicaHandler,
        *,
        namespace: str,
    ) -> None:
        self._redis = redis
        self._id = orchestrator_id
        self._namespace = namespace
        self._node_prefix = keys.node_channel_prefix(namespace)
        self._on_node = on_node
        self._on_replica = on_replica
        self._pubsub = redis.pubsub(ignore_subscribe_messages=True)
        self._own = keys.replica_channel(orchestrator_id, namespace=namespace)
        self.ready = asyncio.Event()

    async def run(self) -> None:
        """Reader loop; reconnects (redis-py re-subscribes) after a Redis outage."""
        await self._pubsub.subscribe(self._own)
        self.ready.set()
        delay = 0.1
        while True:
            try:
                msg = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                delay = 0.1
            except RedisError as exc:
                event("bus_error", logging.WARNING, error=type(exc).__name__)
                await asyncio.sleep(delay)
                delay = min(5.0, delay * 2)
                continue
            if msg is None or msg.get("type") != "message":
                continue
            channel = msg["channel"].decode() if isinstance(msg["channel"], bytes) else str(msg["channel"])
            try:
                if channel == self._own:
                    self._on_replica(channel, msgs.decode_replica_message(msg["data"]))
                elif channel.startswith(self._node_prefix):
                    node_id = channel.removeprefix(self._node_prefix)
                    self._on_node(node_id, msgs.decode_node_message(msg["data"]))
            except ValidationError:
                continue  # not a message this replica knows

    async def close(self) -> None:
        await self._pubsub.aclose()  # type: ignore[no-untyped-call]

    def replica_channel(self, orchestrator_id: str) -> str:
        return keys.replica_channel(orchestrator_id, namespace=self._namespace)

    def node_channel(self, node_id: str) -> str:
        return keys.node_channel(node_id, namespace=self._namespace)

    async def subscribe_node(self, node_id: str) -> None:
        await self._pubsub.subscribe(self.node_channel(node_id))

    async def unsubscribe_node(self, node_id: str) -> None:
        await self._pubsub.unsubscribe(self.node_channel(node_id))

    async def to_node(self, node_id: str, message: msgs.NodeMessage) -> int:
        return int(await self._redis.publish(self.node_channel(node_id), msgs.encode(message)))

    async def to_replica(self, orchestrator_id: str, message: msgs.ReplicaMessage) -> int:
        return int(await self._redis.publish(self.replica_channel(orchestrator_id), msgs.encode(message)))
