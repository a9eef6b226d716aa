"""The routing between relays and node sockets on one replica.

`Routing` owns this replica's node sockets (`local`), the relays waiting on nodes that other
replicas own (`remote_streams`) and the pub/sub bus between replicas. Relays call `start`,
`cancel` and `finish`; node sockets call `route_frame` and `fail_routes`; the bus calls
`on_node_message` / `on_replica_message`; the fleet refresh calls `check_remote_streams` and
`check_pinned_owners`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError
from redis.asyncio import Redis

from apps.core.budget import Budget
from apps.core.nodes.state import NodeState
from apps.core.nodes.store import NodeStore, as_text
from apps.core.protocol import bus as msgs
from apps.core.protocol.dispatch import DispatchRequest
from apps.core.protocol.engine import legacy_assign
from apps.core.protocol.node import (
    CLOSE_REVOKED,
    CLOSE_SUPERSEDED,
    ENDPOINTS_VERSION,
    INTENT_VERSION,
    KV_EVENTS_VERSION,
    Assign,
    Cancel,
    Chunk,
    Done,
    Drain,
    Error,
    decode_node_frame,
    encode,
)
from apps.core.scheduling.prefix import team_scope
from apps.orchestrator.bus import Bus
from apps.orchestrator.connection import NodeConnection, RemoteRoute
from apps.orchestrator.fleet import Fleet
from apps.orchestrator.logs import event
from apps.orchestrator.metrics import Metrics
from apps.orchestrator.scheduling.view import NodeView
from apps.orchestrator.streams import ChunkEv, DoneEv, ErrorEv, LostEv, LostReason, RequestStream


def assignment(
    dreq: DispatchRequest, budget: Budget | None = None, continuation: str | None = None
) -> Assign:
    """The node's assignment: the client's body and the request's intent, as data (the agent
    builds the engine's body, `apps/core/protocol/engine.py`), the team's prefix-cache scope among
    it; a resumed stream passes its budget's remainder and the text to continue."""
    return Assign(
        request_id=dreq.request_id,
        model=dreq.model,
        body=dreq.body,
        budget=dreq.budget if budget is None else budget,
        wants_chunk_usage=dreq.wants_chunk_usage,
        priority_class=dreq.priority_class,
        continuation=continuation,
        cache_scope=team_scope(dreq.team_id),
        endpoint=None if dreq.endpoint == "chat" else dreq.endpoint,
    )


def for_node(conn: NodeConnection, assign: Assign) -> Assign | None:
    """The assignment as `conn`'s protocol version takes it (a version 4 node: the cache scope as
    the body's `cache_salt`, which its engine body keeps); None when the node cannot run it (an
    endpoint other than chat on a node older than version 7: the request goes to another node)."""
    if assign.endpoint is not None and conn.version < ENDPOINTS_VERSION:
        return None
    if conn.version < INTENT_VERSION:
        return legacy_assign(assign)
    if conn.version < KV_EVENTS_VERSION and assign.cache_scope is not None:
        body = {**assign.body, "cache_salt": assign.cache_scope}
        return assign.model_copy(update={"body": body, "cache_scope": None})
    return assign


def _forwarded(msg: msgs.AssignMsg) -> Assign:
    """The assignment another replica forwarded (from a replica older than version 4: `body` only,
    the engine's body built there)."""
    if msg.assign is not None:
        return Assign.model_validate(msg.assign)
    return Assign(request_id=msg.request_id, model=msg.model, body=dict(msg.body))


class Routing:
    def __init__(
        self,
        replica_id: str,
        redis: Redis,
        fleet: Fleet,
        metrics: Metrics,
        node_store: NodeStore,
        wake_queues: Callable[[], None],
        *,
        namespace: str = "",
    ) -> None:
        self.id = replica_id
        self.redis = redis
        self.fleet = fleet
        self.metrics = metrics
        self.node_store = node_store
        self.wake_queues = wake_queues  # the queues look again (a relay ended: its slot is free)
        self.bus = Bus(redis, replica_id, self.on_node_message, self.on_replica_message, namespace=namespace)
        self.local: dict[str, NodeConnection] = {}
        self.remote_streams: dict[str, RequestStream] = {}
        self._background: set[asyncio.Future[Any]] = set()

    # -- relay side ---------------------------------------------------------------

    async def start(self, node: NodeView, assign: Assign, stream: RequestStream) -> bool:
        """Send the assignment to the node (directly or via its owner); False if nothing was sent."""
        conn = self.local.get(node.node_id)
        if conn is not None and not conn.closing.is_set() and not self._moved_away(conn, node):
            if conn.draining or conn.handing_over:
                return False
            sendable = for_node(conn, assign)
            if sendable is None:
                return False
            conn.assigned(assign.request_id, stream)
            return conn.send(sendable)
        stream.owner = node.owner
        self.remote_streams[assign.request_id] = stream
        # `body` as a replica older than version 4 sends it on; `assign`, the intent, for the others.
        message = msgs.AssignMsg(
            origin=self.id,
            request_id=assign.request_id,
            model=assign.model,
            body=legacy_assign(assign).body,
            assign=json.loads(encode(assign)),
        )
        self.metrics.forwarded.labels(op="assign").inc()
        return await self.bus.to_node(node.node_id, message) > 0

    def _moved_away(self, conn: NodeConnection, node: NodeView) -> bool:
        """This replica hands `conn` over and the node registered on another replica (`node.owner`,
        read with the slot): new work goes to its new socket, through its new owner."""
        return conn.handing_over and node.owner not in ("", self.id)

    async def cancel(self, node_id: str, request_id: str) -> None:
        conn = self.local.get(node_id)
        if conn is not None:
            conn.send(Cancel(request_id=request_id))
            return
        self.metrics.forwarded.labels(op="cancel").inc()
        await self.bus.to_node(node_id, msgs.CancelMsg(request_id=request_id))

    async def finish(self, node_id: str, request_id: str, stream: RequestStream) -> None:
        """Forget the relay's routes and free its slot (called shielded when the relay ends)."""
        if self.remote_streams.get(request_id) is stream:
            del self.remote_streams[request_id]
        conn = self.local.get(node_id)
        if conn is not None and conn.routes.get(request_id) is stream:
            del conn.routes[request_id]
            conn.ended_relays.add(request_id)
        if not stream.slot_released:  # else the node socket's reader did it (one Redis call saved)
            await self.fleet.release_slot(node_id, request_id)
        self.wake_queues()

    def check_remote_streams(self) -> None:
        """After a fleet refresh: relays whose node (or its owner) vanished get `Lost`."""
        for stream in list(self.remote_streams.values()):
            node = self.fleet.get(stream.node_id)
            moved = node is not None and node.owner != stream.owner and not stream.owner_pinned
            if node is None or node.state in (NodeState.STALE, NodeState.DEAD) or moved:
                stream.deliver(LostEv(LostReason.OWNER_GONE))

    async def check_pinned_owners(self) -> None:
        """After a fleet refresh: a relay whose node's old owner still carries its request (a
        handover) but whose old owner vanished (kill -9 mid-handover: nobody listens on its
        channel any more) gets `Lost` now instead of at the idle deadline. One Redis call, and
        only while such relays exist."""
        pinned = {s.owner for s in self.remote_streams.values() if s.owner_pinned and s.owner}
        if not pinned:
            return
        counts = await self.redis.pubsub_numsub(*(self.bus.replica_channel(o) for o in pinned))
        alive = {as_text(channel) for channel, listeners in counts if int(listeners) > 0}
        for stream in list(self.remote_streams.values()):
            if stream.owner_pinned and self.bus.replica_channel(stream.owner) not in alive:
                stream.deliver(LostEv(LostReason.OWNER_GONE))

    # -- owner side: frames from a node socket -----------------------------------------

    async def route_frame(
        self, conn: NodeConnection, frame: Chunk | Done | Error, raw: str
    ) -> RequestStream | RemoteRoute | None:
        """Deliver a node's frame to its relay; returns the route it went to."""
        route = conn.routes.get(frame.request_id)
        terminal = not isinstance(frame, Chunk)
        if terminal:
            conn.routes.pop(frame.request_id, None)
        if isinstance(route, RequestStream):
            if isinstance(frame, Chunk):
                route.deliver(ChunkEv(frame.delta))
            elif isinstance(frame, Done):
                route.deliver(DoneEv(frame))
            else:
                route.deliver(ErrorEv(frame))
        elif isinstance(route, RemoteRoute):
            if isinstance(frame, Done) and frame.cached_tokens is not None:
                # The origin replica may be older (a rolling update) and refuse the version-5 field;
                # it does not need it: this replica settles.
                raw = encode(frame.model_copy(update={"cached_tokens": None}))
            heard = await self.bus.to_replica(
                route.origin, msgs.FrameMsg(request_id=frame.request_id, frame=raw)
            )
            if not heard and not terminal:
                # No one listens on the relaying replica's channel: it died (kill -9, OOM) and its
                # gateway stream with it. Stop the engine; the node's `done(abort)` settles what ran.
                conn.routes.pop(frame.request_id, None)
                conn.send(Cancel(request_id=frame.request_id))
                event("relay_gone", node_id=conn.node_id, request_id=frame.request_id, origin=route.origin)
        elif isinstance(frame, Chunk):
            # Output for a request nobody relays any more: stop the engine working for nothing.
            conn.send(Cancel(request_id=frame.request_id))
        return route

    def fail_routes(self, conn: NodeConnection, reason: LostReason) -> list[tuple[str, str]]:
        """The socket is gone: every relay on it gets `Lost`; returns (request_id, origin) to notify."""
        remote: list[tuple[str, str]] = []
        for request_id, route in list(conn.routes.items()):
            if isinstance(route, RequestStream):
                route.deliver(LostEv(reason))
            else:
                remote.append((request_id, route.origin))
        conn.routes.clear()
        return remote

    # -- bus handlers -----------------------------------------------------------------

    def on_node_message(self, node_id: str, msg: msgs.NodeMessage) -> None:
        conn = self.local.get(node_id)
        if isinstance(msg, msgs.AssignMsg):
            self._assign_forwarded(conn, msg)
        elif conn is None:
            return
        elif isinstance(msg, msgs.CancelMsg):
            conn.send(Cancel(request_id=msg.request_id))
        elif isinstance(msg, msgs.DrainMsg):
            self._spawn(self.drain_local(node_id))
        elif isinstance(msg, msgs.LoadModelMsg):
            return  # retired (an older replica's, during a rolling update): never sent on to a node
        elif isinstance(msg, msgs.RevokeMsg):
            conn.close(CLOSE_REVOKED, "node token revoked")
        elif isinstance(msg, msgs.SupersedeMsg) and msg.conn != conn.conn_id:
            if conn.handing_over:
                conn.handed_over = True  # registered on another replica: this socket finishes its requests
            else:
                conn.close(CLOSE_SUPERSEDED, "node registered again on another connection")

    def _assign_forwarded(self, conn: NodeConnection | None, msg: msgs.AssignMsg) -> None:
        request_id = msg.request_id
        if conn is not None and (conn.handed_over or (conn.handing_over and msg.origin == self.id)):
            # The node's new owner got this message too and sends it on (this replica forwards its
            # own relays' work only once the node registered elsewhere: `_moved_away`).
            return
        sendable = None if conn is None else for_node(conn, _forwarded(msg))
        if conn is not None and sendable is not None and not conn.closing.is_set() and not conn.draining:
            conn.assigned(request_id, RemoteRoute(msg.origin))
            if conn.send(sendable):
                if conn.handing_over:  # assigned just before the handover began: relayed from here
                    self._spawn(self.bus.to_replica(msg.origin, msgs.HandoverMsg(request_id=request_id)))
                return
            conn.routes.pop(request_id, None)
        self._spawn(
            self.bus.to_replica(msg.origin, msgs.LostMsg(request_id=request_id, reason="unreachable"))
        )

    def on_replica_message(self, _channel: str, msg: msgs.ReplicaMessage) -> None:
        stream = self.remote_streams.get(msg.request_id)
        if stream is None:
            return
        if isinstance(msg, msgs.HandoverMsg):
            stream.owner_pinned = True
            return
        if isinstance(msg, msgs.LostMsg):
            stream.deliver(
                LostEv(LostReason.UNREACHABLE if msg.reason == "unreachable" else LostReason.NODE_GONE)
            )
            return
        try:
            frame = decode_node_frame(msg.frame)
        except ValidationError:
            return
        if isinstance(frame, Chunk):
            stream.deliver(ChunkEv(frame.delta))
        elif isinstance(frame, Done):
            stream.deliver(DoneEv(frame))
        elif isinstance(frame, Error):
            stream.deliver(ErrorEv(frame))

    async def drain_local(self, node_id: str) -> bool:
        conn = self.local.get(node_id)
        if conn is None or conn.closing.is_set():
            return False
        if not conn.draining:
            conn.draining = True
            conn.send(Drain())
            await self.fleet.mark_draining(node_id, conn.conn_id)
            await self.node_store.record_event(node_id, "draining", self.id)
            event("node_draining", node_id=node_id, in_flight=len(conn.routes))
        return True

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
