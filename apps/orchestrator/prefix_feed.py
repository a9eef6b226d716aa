"""What a node says of its engine's prefix cache (protocol version 5), taken in by the replica that
owns its socket: KV events into the node's index (`PrefixIndex`), prefix announcements into Redis
for every replica's picker (`PrefixStore`).

A node is trusted with its own cache only, and only as far as cheap checks reach: frames on a
version 1-4 socket, for a model the node did not register, or from a socket that no longer owns the
node (a late frame of a superseded socket) are dropped; an announcement must name a block the
node's own events stored, at the depth it claims. Redis trouble here never ends the node's socket:
prefix routing is an optimisation, the writes are best effort and counted.
"""

from __future__ import annotations

import logging

from redis.exceptions import RedisError

from apps.core.protocol.node import KV_EVENTS_VERSION, KvEvents, KvPrefix, KvReset
from apps.orchestrator.connection import NodeConnection
from apps.orchestrator.logs import event
from apps.orchestrator.metrics import Metrics
from apps.orchestrator.prefix_index import PrefixIndex
from apps.orchestrator.prefix_store import PrefixStore


class PrefixFeed:
    def __init__(self, index: PrefixIndex, store: PrefixStore, metrics: Metrics) -> None:
        self.index = index
        self.store = store
        self.metrics = metrics

    async def take(self, conn: NodeConnection, frame: KvEvents | KvPrefix | KvReset, owned: bool) -> None:
        if not owned or conn.version < KV_EVENTS_VERSION or frame.model not in conn.models:
            self.metrics.prefix_frames_dropped.inc()
            return
        try:
            if isinstance(frame, KvEvents):
                overflows = self.index.overflows
                gone = self.index.apply(conn.node_id, frame)
                if self.index.overflows > overflows:
                    self.metrics.prefix_frames_dropped.inc()
                    event("prefix_index_overflow", logging.WARNING, node_id=conn.node_id, model=frame.model)
                if gone:
                    await self.store.retract(conn.node_id, frame.model, gone)
            elif isinstance(frame, KvPrefix):
                if self.index.announce(conn.node_id, frame):
                    await self.store.announce(
                        conn.node_id, frame.model, frame.key, frame.blocks, conn.conn_id
                    )
                else:
                    self.metrics.prefix_frames_dropped.inc()
            else:
                self.index.reset(conn.node_id, frame.model)
                await self.store.forget(conn.node_id, frame.model)
        except (RedisError, OSError) as exc:
            self.metrics.prefix_store_errors.inc()
            event("prefix_store_failed", logging.WARNING, node_id=conn.node_id, error=type(exc).__name__)

    async def closed(self, conn: NodeConnection, code: int, *, elsewhere: bool) -> None:
        """The node's socket here closed. Its index goes; its announcements too unless the node went
        on on another socket (a handover, a supersede): they are then the new owner's."""
        self.index.forget(conn.node_id)
        if elsewhere:
            return
        try:
            await self.store.forget(conn.node_id)
        except (RedisError, OSError) as exc:
            self.metrics.prefix_store_errors.inc()
            event("prefix_store_failed", logging.WARNING, node_id=conn.node_id, error=type(exc).__name__)
