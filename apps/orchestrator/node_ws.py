"""`WS /v1/nodes/connect`: registration handshake, then one reader, one writer and one
watchdog per connection in a TaskGroup; when any of them ends, all end.

Handshake order: parse the `register` frame, check the protocol version (close 4001), verify
the node token (one primary-key read in PostgreSQL and an HMAC; close 4003, and an attempt that
fails draws from a bucket of its own: past it the refusal is 4029 with a retry hint), check the
frame against what the token allows (its models and location; close 4003), then take a token
from the registration bucket, which only verified nodes reach (refusal with a spread-out retry
hint, close 4029), so bogus registrations cannot lock real nodes out. Only then is the node
written to PostgreSQL (registration event), to Redis (heartbeat hash with this replica as
owner) and subscribed on its pub/sub channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiohttp import WSMsgType, web
from pydantic import ValidationError

from apps.core.aio import shielded, until_first_ends
from apps.core.protocol import bus as msgs
from apps.core.protocol.node import (
    BATCHING_VERSION,
    CLOSE_AUTH_FAILED,
    CLOSE_GOING_AWAY,
    CLOSE_HANDED_OVER,
    CLOSE_HEARTBEAT_TIMEOUT,
    CLOSE_NORMAL,
    CLOSE_PROTOCOL_ERROR,
    CLOSE_REGISTRATION_REFUSED,
    CLOSE_REVOKED,
    CLOSE_SUPERSEDED,
    CLOSE_UNSUPPORTED_VERSION,
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    Chunk,
    Done,
    Drained,
    Error,
    HandedOver,
    Heartbeat,
    KvEvents,
    KvPrefix,
    KvReset,
    Register,
    RegisterAck,
    RegisterRefused,
    batch_messages,
    decode_node_frame,
    encode,
    peek_version,
    split_frames,
)
from apps.orchestrator.connection import NodeConnection, not_permitted
from apps.orchestrator.fleet import HEARTBEAT_REVOKED, HEARTBEAT_SUPERSEDED
from apps.orchestrator.handover import SocketHandover
from apps.orchestrator.liveness import watch_heartbeats
from apps.orchestrator.logs import event
from apps.orchestrator.plane import SocketParts
from apps.orchestrator.ratelimit import TokenBucket
from apps.orchestrator.settle import SettleJob, Settler
from apps.orchestrator.streams import ChunkEv, LostReason, RequestStream

_CLOSE_HANDSHAKE_S = 2.0  # a peer that does not answer the close frame in this time is gone anyway


class NodeSockets:
    def __init__(
        self, parts: SocketParts, settler: Settler, bucket: TokenBucket, unauthenticated: TokenBucket
    ) -> None:
        self.parts = parts
        self.settler = settler
        self.bucket = bucket
        self.unauthenticated = unauthenticated
        self._ws: dict[str, web.WebSocketResponse] = {}
        settings = parts.settings
        self.handover = SocketHandover(
            parts.routing, parts.fleet, parts.metrics, settings.handover_deadline_s, settings.shutdown_grace_s
        )
        self.all_closed = asyncio.Event()  # set when this replica holds no node socket
        self.all_closed.set()

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=8 * 1024 * 1024)
        await ws.prepare(request)
        accepted = await self._handshake(ws)
        if accepted is None:
            return ws
        conn, frame = accepted
        try:
            await self._activate(ws, conn, frame)
            await until_first_ends(
                self._reader(ws, conn), self._writer(ws, conn), watch_heartbeats(conn, self.parts.settings)
            )
        finally:
            await shielded(self._teardown(ws, conn), self.parts.settings.shutdown_grace_s, "node_teardown")
        return ws

    async def _refuse(
        self, ws: web.WebSocketResponse, code: int, reason: str, retry: float | None = None
    ) -> None:
        self.parts.metrics.registrations_refused.labels(reason=reason).inc()
        await ws.send_str(encode(RegisterRefused(reason=reason, retry_after_s=retry)))
        await ws.close(code=code, message=reason.encode()[:120])

    async def _handshake(self, ws: web.WebSocketResponse) -> tuple[NodeConnection, Register] | None:
        parts, settings = self.parts, self.parts.settings
        try:
            msg = await ws.receive(timeout=settings.register_timeout_s)
        except TimeoutError:
            await ws.close(code=CLOSE_PROTOCOL_ERROR, message=b"no register frame")
            return None
        if msg.type != WSMsgType.TEXT:
            await ws.close(code=CLOSE_PROTOCOL_ERROR, message=b"expected a register frame")
            return None
        if parts.lifecycle.stopping:  # a node handed over by this replica must land on another one
            await self._refuse(ws, CLOSE_GOING_AWAY, "orchestrator_stopping")
            return None
        version = peek_version(msg.data)
        if version is not None and version not in SUPPORTED_VERSIONS:
            await self._refuse(ws, CLOSE_UNSUPPORTED_VERSION, f"unsupported protocol version {version}")
            return None
        try:
            frame = decode_node_frame(msg.data)
        except ValidationError:
            await ws.close(code=CLOSE_PROTOCOL_ERROR, message=b"invalid register frame")
            return None
        if not isinstance(frame, Register):
            await ws.close(code=CLOSE_PROTOCOL_ERROR, message=b"first frame must be register")
            return None
        if frame.version not in SUPPORTED_VERSIONS:
            await self._refuse(ws, CLOSE_UNSUPPORTED_VERSION, f"unsupported protocol version {frame.version}")
            return None
        identity = await parts.node_store.identify(frame.node_id, frame.token)
        if identity is None:
            retry = self.unauthenticated.try_take()
            if retry is not None:
                await self._refuse(
                    ws, CLOSE_REGISTRATION_REFUSED, "rate_limited_unauthenticated", round(retry, 3)
                )
            else:
                await self._refuse(ws, CLOSE_AUTH_FAILED, "invalid or revoked node token")
            return None
        refusal = not_permitted(identity, frame)
        if refusal is not None:
            await self._refuse(ws, CLOSE_AUTH_FAILED, refusal)
            return None
        retry = self.bucket.try_take()
        if retry is not None:
            await self._refuse(ws, CLOSE_REGISTRATION_REFUSED, "rate_limited", round(retry, 3))
            return None
        models = {m.name: m.max_num_seqs for m in frame.models}
        conn = NodeConnection(
            node_id=frame.node_id,
            location=identity.location,  # the admin's word wins over the node's claim
            gpus=frame.gpus,
            models=models,
            send_limit=settings.send_queue_frames,
            monotonic=parts.monotonic,
            batching=frame.version >= BATCHING_VERSION,
            version=frame.version,
            revisions={m.name: m.revision for m in frame.models if m.revision},
        )
        return conn, frame

    async def _activate(self, ws: web.WebSocketResponse, conn: NodeConnection, frame: Register) -> None:
        """Take ownership (inside the caller's try: a failure here still tears down)."""
        parts, settings = self.parts, self.parts.settings
        previous = parts.routing.local.get(frame.node_id)
        if previous is not None:
            previous.close(CLOSE_SUPERSEDED, "node registered again")
            # Before the ack: the agent's replays that follow it are held against these counts.
            await self.settler.keep_relayed(previous)
        parts.routing.local[frame.node_id] = conn
        self.all_closed.clear()
        self._ws[conn.conn_id] = ws
        await parts.routing.bus.subscribe_node(frame.node_id)
        # Another replica that still holds an older socket of this node lets it go.
        await parts.routing.bus.to_node(frame.node_id, msgs.SupersedeMsg(conn=conn.conn_id))
        await parts.fleet.write_heartbeat(
            frame.node_id, conn.conn_id, conn.hash_fields(parts.routing.id), register=True
        )
        await parts.node_store.record_registration(
            node_id=frame.node_id,
            location=conn.location,
            gpus=frame.gpus,
            models=[m.model_dump() for m in frame.models],
            orchestrator_id=parts.routing.id,
            agent_version=frame.agent_version,
        )
        await parts.fleet.refresh()
        await ws.send_str(
            encode(
                RegisterAck(
                    orchestrator_id=parts.routing.id,
                    heartbeat_interval_s=settings.heartbeat_interval_s,
                    # Relays of requests from a previous socket ended with that socket.
                    unknown_requests=list(frame.in_flight),
                )
            )
        )
        parts.metrics.registrations.inc()
        parts.wake_queues()
        event("node_registered", node_id=frame.node_id, location=conn.location, models=list(conn.models))

    async def _reader(self, ws: web.WebSocketResponse, conn: NodeConnection) -> None:
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                if msg.type == WSMsgType.ERROR:
                    conn.close(1011, "websocket error")
                    return
                continue
            # One frame, or (protocol version 2) a batch of frames, one per line, in order.
            for text in split_frames(msg.data):
                if not await self._frame(conn, text) or conn.closing.is_set():
                    return

    async def _frame(self, conn: NodeConnection, text: str) -> bool:
        """Handle one frame from the node; False when the connection must end."""
        parts = self.parts
        try:
            frame = decode_node_frame(text)
        except ValidationError:
            conn.close(CLOSE_PROTOCOL_ERROR, "invalid frame")
            return False
        if type(frame) is Chunk:
            # Hot path (one per relayed chunk): a local relay gets it synchronously.
            route = conn.routes.get(frame.request_id)
            conn.count_relayed(frame.request_id, frame.delta)  # what its report is held against
            if type(route) is RequestStream:
                if route.deliver(ChunkEv(frame.delta)):
                    # The relay was parked (typically for its first chunk): let it write before
                    # this reader goes on with the rest of the batch, which is often a whole
                    # engine step of other requests' chunks.
                    await asyncio.sleep(0)
            else:
                await parts.routing.route_frame(conn, frame, text)
        elif isinstance(frame, Heartbeat):
            await self._heartbeat(conn, frame)
        elif isinstance(frame, Done | Error):
            await self._finished(conn, frame, text)
        elif isinstance(frame, Drained):
            conn.drained = True
            await parts.node_store.record_event(conn.node_id, "drained", parts.routing.id, frame.reason)
            event("node_drained", node_id=conn.node_id)
            # The node's last frame: every frame before it has been handled (in order, above), so
            # this side closes the socket; the node waits for that close before it goes.
            conn.close(CLOSE_NORMAL, "drained")
            return False
        elif isinstance(frame, KvEvents | KvPrefix | KvReset):
            await parts.prefix_feed.take(conn, frame, owned=parts.routing.local.get(conn.node_id) is conn)
        elif isinstance(frame, HandedOver):
            conn.handed_over = True  # ownership moved; this socket carries its requests to their end
            event(
                "node_handed_over", node_id=conn.node_id, to=frame.orchestrator_id, in_flight=len(conn.routes)
            )
        else:
            conn.close(CLOSE_PROTOCOL_ERROR, "unexpected register frame")
            return False
        return True

    async def _finished(self, conn: NodeConnection, frame: Done | Error, text: str) -> None:
        """A request ended on the node: route it, then settle (or free the slot of one that produced nothing)."""
        # Held from the report's read: routing drops its route before another replica's relay heard it, and a
        # handover closing the socket in that window lost the settle and its `done_ack` (a loaded CI run).
        conn.settling += 1
        try:
            parts = self.parts
            # None: not assigned on this socket (a journal replay, or not this node's: refused in settle).
            relayed = conn.relayed.pop(frame.request_id, None)
            route = await parts.routing.route_frame(conn, frame, text)
            replayed = conn.replayed_abort(frame, route)
            if isinstance(frame, Done) or frame.chunks_sent > 0:
                # The settle job frees the node slot in the same Redis call as its done record,
                # off this reader's path (it is not awaited here for every finished request).
                ack_to = conn if isinstance(frame, Done) else None
                await self.settler.submit(
                    SettleJob(
                        conn.node_id,
                        frame.request_id,
                        frame.prompt_tokens,
                        frame.completion_tokens,
                        ack_to,
                        from_error=isinstance(frame, Error),
                        replayed_abort=replayed,
                        relayed=relayed,
                        source=conn,
                        cached_tokens=conn.cached_tokens(frame),
                    )
                )
            else:
                await parts.fleet.release_slot(conn.node_id, frame.request_id)
                parts.wake_queues()
            if isinstance(route, RequestStream):
                route.slot_released = True
        finally:
            conn.settling -= 1

    async def _heartbeat(self, conn: NodeConnection, frame: Heartbeat) -> None:
        parts = self.parts
        conn.touch()
        conn.kv_cache_usage, conn.queue_depth = frame.kv_cache_usage, frame.queue_depth
        conn.gpu_util, conn.running = frame.gpu_util, frame.running
        became_draining = frame.draining and not conn.draining
        conn.draining = conn.draining or frame.draining
        result = await parts.fleet.write_heartbeat(
            conn.node_id, conn.conn_id, conn.hash_fields(parts.routing.id)
        )
        if result == HEARTBEAT_REVOKED:
            conn.close(CLOSE_REVOKED, "node token revoked")
        elif result == HEARTBEAT_SUPERSEDED and conn.handing_over:
            conn.handed_over = True  # the node registered elsewhere; this socket's requests go on
        elif result == HEARTBEAT_SUPERSEDED:
            conn.close(CLOSE_SUPERSEDED, "node registered again on another connection")
        elif became_draining:
            await parts.node_store.record_event(conn.node_id, "draining", parts.routing.id, "node")
        parts.wake_queues()

    async def _writer(self, ws: web.WebSocketResponse, conn: NodeConnection) -> None:
        # Parked on the queue itself: a frame queued for an idle connection (an `assign`) goes out
        # on the next event-loop turn. The watchdog ends when the connection closes, and the
        # TaskGroup then cancels this task.
        queue = conn.send_q
        while not conn.closing.is_set():
            texts = [await queue.get()]
            while conn.batching and not queue.empty():
                texts.append(queue.get_nowait())
            if conn.closing.is_set():
                return
            try:
                for text in batch_messages(texts) if len(texts) > 1 else texts:
                    await ws.send_str(text)
            except ConnectionError:
                conn.close(1011, "connection lost")  # the reader sees the close too
                return

    async def _teardown(self, ws: web.WebSocketResponse, conn: NodeConnection) -> None:
        parts = self.parts
        code = conn.close_code if conn.closing.is_set() else CLOSE_NORMAL
        conn.close(code, conn.close_reason or "closed")
        self._ws.pop(conn.conn_id, None)
        # Its relayed counts of unreported requests, while it is still the node's socket here: a
        # later report (the agent's journal replay on another socket) is held against them.
        await self.settler.keep_relayed(conn)
        # The relays first: a silent peer (a link that died without FIN or RST) never answers the
        # close handshake (last, below), and its streams must not wait for that (they resume elsewhere).
        reason = LostReason.SHUTDOWN if parts.lifecycle.stopping else LostReason.NODE_GONE
        for request_id, origin in parts.routing.fail_routes(conn, reason):
            await parts.routing.bus.to_replica(
                origin, msgs.LostMsg(request_id=request_id, reason=reason.value)
            )
        owned = parts.routing.local.get(conn.node_id) is conn
        if owned:
            del parts.routing.local[conn.node_id]
            elsewhere = conn.handed_over or code in (CLOSE_SUPERSEDED, CLOSE_HANDED_OVER)
            await parts.prefix_feed.closed(conn, code, elsewhere=elsewhere)
            if not parts.routing.local:
                self.all_closed.set()
            await parts.routing.bus.unsubscribe_node(conn.node_id)
        await parts.fleet.remove(conn.node_id, conn.conn_id)
        parts.fleet.forget(conn.node_id)
        # Routes added since (none should be: the connection is closing) fail too.
        for request_id, origin in parts.routing.fail_routes(conn, reason):
            await parts.routing.bus.to_replica(
                origin, msgs.LostMsg(request_id=request_id, reason=reason.value)
            )
        death = conn.death_reason(code)
        if death is not None and not parts.lifecycle.stopping:
            parts.metrics.node_deaths.labels(reason=death).inc()
        if owned and code != CLOSE_SUPERSEDED:
            quiet = "handed_over" if code == CLOSE_HANDED_OVER else "drained"
            await parts.node_store.record_event(
                conn.node_id, "disconnected", parts.routing.id, death or quiet
            )
        event("node_disconnected", logging.INFO, node_id=conn.node_id, code=code, reason=death or "drained")
        # Last, and bounded: the close handshake waits for the peer, which a silently cut node never
        # answers (aiohttp waits up to its close timeout). Routing and the node's requests must not wait.
        if not ws.closed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_CLOSE_HANDSHAKE_S):
                    await ws.close(code=code, message=conn.close_reason.encode()[:120])

    async def close_all(self) -> None:
        """Replica shutdown: hand every node socket over (`apps.orchestrator.handover`; a node
        older than protocol version 3 is closed with 1001 and reconnects elsewhere)."""
        await self.handover.run()


__all__ = ["CLOSE_HEARTBEAT_TIMEOUT", "PROTOCOL_VERSION", "NodeSockets"]
