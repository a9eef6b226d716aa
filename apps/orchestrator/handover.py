"""Replica shutdown without cut streams: the node socket handover (protocol version 3).

A stopping replica is not ready (`/readyz` 503), refuses new dispatches (503 with
`RETRY_ELSEWHERE`, so the gateway tries another replica: nothing ran) — the ones waiting in its
queues too (`Queues.close`) — and new registrations,
and hands each node socket over instead of closing it:

1. the node is marked draining in Redis (no replica picks it until it registers elsewhere), then
   gets `handover {deadline_s}`;
2. the node registers on another replica (which takes ownership: `node:{id}.conn` becomes the
   new socket's) and answers `handed_over` on the old socket; the old socket keeps carrying the
   chunks and `done`s of the requests that were running on it (its heartbeat watchdog and the
   superseded-socket checks are off while it hands over: `NodeConnection.handing_over`);
3. once none of its requests runs any more and their `done_ack`s went out, this side closes it
   with 4011 (`CLOSE_HANDED_OVER`; 1001 if the node had not registered elsewhere yet: a socket
   with nothing in flight is not kept).

Bounded: at `deadline_s` the node ends what still runs there with a `node_draining` error carrying
the exact tokens produced (the relay resumes it elsewhere or ends it with a clean error event, and
settles those tokens); `grace_s` later the socket closes whatever happened. A node older than
version 3 gets today's 1001 close (reconnect elsewhere).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiohttp import web

from apps.core.errors import Unavailable, http_error
from apps.core.protocol.bus import HandoverMsg
from apps.core.protocol.dispatch import RETRY_ELSEWHERE
from apps.core.protocol.node import CLOSE_GOING_AWAY, CLOSE_HANDED_OVER, HANDOVER_VERSION, Handover
from apps.orchestrator.connection import NodeConnection, RemoteRoute
from apps.orchestrator.fleet import Fleet
from apps.orchestrator.logs import event
from apps.orchestrator.metrics import Metrics
from apps.orchestrator.routing import Routing

_CHECK_S = 0.05  # how often a socket being handed over is looked at (only during a shutdown)


STOPPING = "orchestrator_stopping"


def stopping_refusal() -> Unavailable:
    """What a stopping replica raises in its queue's waiters and answers new dispatches."""
    return Unavailable("this orchestrator replica is stopping", code=STOPPING)


def refuse_dispatch(request_id: str) -> web.Response:
    """A stopping replica's answer to a dispatch: nothing ran, the gateway sends it elsewhere
    (the reservation stays: the other replica's relay uses it)."""
    status, headers, body = http_error(stopping_refusal(), {"x-request-id": request_id, RETRY_ELSEWHERE: "1"})
    return web.json_response(body, status=status, headers=headers)


class SocketHandover:
    def __init__(
        self, routing: Routing, fleet: Fleet, metrics: Metrics, deadline_s: float, grace_s: float
    ) -> None:
        self.routing = routing
        self.fleet = fleet
        self.metrics = metrics
        self.deadline_s = deadline_s
        self.grace_s = grace_s

    @property
    def bound_s(self) -> float:
        """How long the whole handover may take."""
        return self.deadline_s + self.grace_s

    async def run(self) -> None:
        """Hand over (or, below version 3, close) every node socket of this replica; returns when
        every socket is closed or the bound passed."""
        conns = list(self.routing.local.values())
        event("handover_started", nodes=len(conns), in_flight=sum(len(c.routes) for c in conns))
        async with asyncio.TaskGroup() as tg:
            for conn in conns:
                tg.create_task(self._one(conn), name=f"handover-{conn.node_id}")

    async def _one(self, conn: NodeConnection) -> None:
        if conn.closing.is_set():
            return
        if conn.version < HANDOVER_VERSION or conn.draining:
            conn.close(CLOSE_GOING_AWAY, "orchestrator shutting down")
            return
        conn.handing_over = True
        await self.fleet.mark_draining(conn.node_id, conn.conn_id)
        for request_id, route in list(conn.routes.items()):
            if isinstance(route, RemoteRoute):  # its relay must not take the new owner for a loss
                await self.routing.bus.to_replica(route.origin, HandoverMsg(request_id=request_id))
        conn.send(Handover(deadline_s=self.deadline_s))
        event("node_handover", node_id=conn.node_id, in_flight=len(conn.routes), deadline_s=self.deadline_s)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.bound_s
        while not conn.closing.is_set():
            if conn.carries_nothing():
                # Nothing (left) to carry: an idle socket is not kept open for the node to find
                # another replica (if none is up, it would wait out the bound for nothing). A done
                # waiting for its settle keeps it open: its `done_ack` goes out on this socket.
                conn.close(CLOSE_HANDED_OVER if conn.handed_over else CLOSE_GOING_AWAY, "handed over")
                break
            if loop.time() >= give_up:
                left = len(conn.routes)
                event("node_handover_timeout", logging.WARNING, node_id=conn.node_id, in_flight=left)
                conn.close(CLOSE_HANDED_OVER if conn.handed_over else CLOSE_GOING_AWAY, "handover deadline")
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(conn.closing.wait(), _CHECK_S)
        self.metrics.handovers.labels(outcome="handed_over" if conn.handed_over else "closed").inc()
