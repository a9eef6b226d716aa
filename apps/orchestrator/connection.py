"""One node's WebSocket as held by its owner replica: identity, live load, routes, send queue.

The reader task (in `node_ws`) updates it; the writer task drains `send_q` (bounded: a
node that cannot keep up with its frames is disconnected rather than buffered forever).
`routes` maps each request running on the node to where its frames go: a local
`RequestStream`, or the replica that took the dispatch (`RemoteRoute`, via pub/sub).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from apps.core.nodes.store import NodeIdentity
from apps.core.protocol.node import (
    CLOSE_HANDED_OVER,
    CLOSE_HEARTBEAT_TIMEOUT,
    CLOSE_NORMAL,
    CLOSE_REVOKED,
    CLOSE_SUPERSEDED,
    KV_EVENTS_VERSION,
    Done,
    Error,
    Register,
    _Frame,
    encode,
)
from apps.orchestrator.streams import RequestStream
from apps.orchestrator.tolerance import content_events


@dataclass(frozen=True)
class RemoteRoute:
    origin: str  # orchestrator id of the replica relaying this request


Route = RequestStream | RemoteRoute


class NodeConnection:
    def __init__(
        self,
        *,
        node_id: str,
        location: str,
        gpus: int,
        models: dict[str, int],
        send_limit: int,
        monotonic: Callable[[], float] = time.monotonic,
        batching: bool = False,
        version: int = 1,
        revisions: dict[str, str] | None = None,
    ) -> None:
        self.node_id = node_id
        self.batching = batching  # protocol version 2: frames queued together leave as one message
        self.version = version
        # Replica shutdown (`apps.orchestrator.handover`): `handover` sent; the node said it registered elsewhere.
        self.handing_over = False
        self.handed_over = False
        self.conn_id = uuid.uuid4().hex
        self.location = location
        self.gpus = gpus
        self.models = models
        # The model revision each engine serves (protocol version 6; absent: not said). Published
        # with the heartbeat (`revisions`), recorded with each assignment, billed per request.
        self.revisions = dict(revisions or {})
        self._clock = monotonic
        self.send_q: asyncio.Queue[str] = asyncio.Queue(maxsize=send_limit)
        self.routes: dict[str, Route] = {}
        # Requests this socket carried whose relay ended before the node's last frame (a cancel on
        # its way): that frame is not a journal replay from another socket (`node_ws`).
        self.ended_relays: set[str] = set()
        # Content events relayed per request assigned on this socket and not yet reported (its
        # `done`/`error` settles against them; at close they go to Redis: `Settler.add_relayed`).
        self.relayed: dict[str, int] = {}
        # Reports of this socket being routed or in the settle queue: their `done_ack` is still to
        # come (a handover does not close the socket before it went out: `carries_nothing`).
        self.settling = 0
        self.closing = asyncio.Event()
        self.close_code = CLOSE_NORMAL
        self.close_reason = ""
        self.last_heartbeat = monotonic()
        self.draining = False
        self.drained = False
        self.kv_cache_usage = 0.0
        self.queue_depth = 0
        self.gpu_util: float | None = None
        self.running = 0

    def send(self, frame: _Frame) -> bool:
        """Queue a frame for the writer; False when the connection is closing or saturated."""
        if self.closing.is_set():
            return False
        try:
            self.send_q.put_nowait(encode(frame))
        except asyncio.QueueFull:
            self.close(1011, "send queue full")
            return False
        return True

    def death_reason(self, code: int) -> str | None:
        """Why the node is gone when its socket closed with `code` (None: it left in order: drained,
        or handed over to another replica)."""
        if self.drained or (code == CLOSE_NORMAL and self.draining) or code == CLOSE_HANDED_OVER:
            return None
        if code in (CLOSE_REVOKED, CLOSE_SUPERSEDED):
            return "revoked" if code == CLOSE_REVOKED else "superseded"
        if code == CLOSE_HEARTBEAT_TIMEOUT:
            return "heartbeat_timeout"
        return "socket_closed"

    def carries_nothing(self) -> bool:
        """No request runs on this socket, no report of it waits for its settle and `done_ack`, and
        nothing queued is unsent: closing it now loses nothing."""
        return not self.routes and self.settling == 0 and self.send_q.empty()

    def assigned(self, request_id: str, route: Route) -> None:
        """A request assigned on this socket: its frames go to `route`, its events are counted."""
        self.routes[request_id] = route
        self.relayed.setdefault(request_id, 0)

    def replayed_abort(self, frame: Done | Error, route: object) -> bool:
        """A `done(abort)` this socket never carried: the agent aborted when its socket to another
        replica dropped and replays it from its journal (`settle.Settler._defer`)."""
        ended_here = frame.request_id in self.ended_relays
        self.ended_relays.discard(frame.request_id)
        return route is None and not ended_here and isinstance(frame, Done) and frame.finish_reason == "abort"

    def cached_tokens(self, frame: Done | Error) -> int:
        """The prompt tokens a `done` says its engine found cached: a version 5 field, never taken
        from an older socket (the settle bounds it by the prompt tokens billed)."""
        if isinstance(frame, Done) and self.version >= KV_EVENTS_VERSION:
            return frame.cached_tokens or 0
        return 0

    def count_relayed(self, request_id: str, delta: str) -> None:
        """A chunk crossed this socket: count its events if the request was assigned here (also
        after its relay ended: the engine's tokens until the cancel reached it are billed)."""
        count = self.relayed.get(request_id)
        if count is not None:
            self.relayed[request_id] = count + content_events(delta)

    def take_relayed(self) -> dict[str, int]:
        """The counts of requests not reported on this socket (it closes), forgotten here."""
        counts, self.relayed = self.relayed, {}
        return counts

    def close(self, code: int, reason: str) -> None:
        if not self.closing.is_set():
            self.close_code = code
            self.close_reason = reason
            self.closing.set()

    def heartbeat_age(self) -> float:
        return self._clock() - self.last_heartbeat

    def touch(self) -> None:
        self.last_heartbeat = self._clock()

    def hash_fields(self, orchestrator_id: str) -> dict[str, str | int | float]:
        import json

        return {
            "orchestrator_id": orchestrator_id,
            "location": self.location,
            "gpus": self.gpus,
            "models": json.dumps(self.models, separators=(",", ":")),
            "queue_depth": self.queue_depth,
            "kv_cache_usage": self.kv_cache_usage,
            "gpu_util": "" if self.gpu_util is None else self.gpu_util,
            "running": self.running,
            "in_flight": len(self.routes),
            "draining": "1" if self.draining or self.handing_over else "0",
            "revisions": json.dumps(self.revisions, separators=(",", ":")),
        }


def not_permitted(identity: NodeIdentity, frame: Register) -> str | None:
    """Why the token does not admit this registration (None: it does): a node registers only the
    models and the location its token was issued for (issue 21 item 4). The location routed on is
    the token's in any case (`NodeConnection(location=...)`); a node claiming another is refused,
    not silently moved: an on-premises agent started with `--location cloud` (or the reverse) is a
    misconfiguration its operator must see."""
    if identity.models is not None and not {m.name for m in frame.models} <= set(identity.models):
        return "model_not_permitted"
    if frame.location != identity.location:
        return "location_not_permitted"
    return None
