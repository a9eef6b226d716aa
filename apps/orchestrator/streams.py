"""One relayed request as seen by the replica that took the dispatch: a bounded event queue.

Events come from the node's reader task (local node) or from the pub/sub reader (node
owned by another replica). Delivery never blocks those readers: the queue holds at most
`limit` events plus one slot kept for the terminal event; a relay that falls that far
behind gets `Lost("relay_overflow")` and is cancelled on the node, so one slow gateway
connection cannot stall every other stream of the node.

Hot path (one call per relayed chunk): `next()` returns a queued event without awaiting,
and otherwise waits on one plain future. The per-phase deadline is a loop-time stamp;
one timer per stream checks it and re-arms itself for the stamp when it fires early, so
a chunk costs no task and no timer (`asyncio.wait_for` cost both, per chunk). The relay
takes every chunk already queued with `take_chunks()` and writes them in one write; while it
waits and the gateway's socket is writable, `sink` writes each chunk from `deliver` itself
(no task wake-up, no response-writer layers per chunk).
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from apps.core.protocol.node import Done, Error


class LostReason(enum.StrEnum):
    NODE_GONE = "node_gone"  # socket closed, heartbeat missed, key expired, superseded
    OWNER_GONE = "owner_gone"  # the replica holding the node's socket vanished
    UNREACHABLE = "unreachable"  # nobody owns the node any more / its send queue is full
    RELAY_OVERFLOW = "relay_overflow"
    SHUTDOWN = "shutdown"


@dataclass(frozen=True)
class ChunkEv:
    delta: str


@dataclass(frozen=True)
class DoneEv:
    frame: Done


@dataclass(frozen=True)
class ErrorEv:
    frame: Error


@dataclass(frozen=True)
class LostEv:
    reason: LostReason


StreamEvent = ChunkEv | DoneEv | ErrorEv | LostEv


_EARLY_S = 0.001  # a timer firing this close to the deadline counts as on time


class RequestStream:
    def __init__(self, request_id: str, node_id: str, limit: int) -> None:
        self.request_id = request_id
        self.node_id = node_id
        self._limit = limit
        # Bounded by `deliver`: at most `limit` chunks plus the one terminal event.
        self._events: deque[StreamEvent] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._deadline = 0.0  # loop time the current `next()` gives up at
        self._timer: asyncio.TimerHandle | None = None
        self.finished = False  # a terminal event was delivered
        self.owner = ""  # for a node owned by another replica: that replica's id
        # The owner is handing the node over (`apps.orchestrator.handover`): it still relays this
        # request, so the node's new owner in the fleet view does not mean the stream is lost.
        self.owner_pinned = False
        self.slot_released = False  # done/error: the node socket's reader (or its settle job) frees the slot
        # The relay's direct writer (`relay.py`): offered each chunk while the relay waits in `next()`
        # with nothing queued; a chunk it takes (True) is already on the gateway's socket.
        self.sink: Callable[[str], bool] | None = None
        self._wait_s = 0.0

    def deliver(self, event: StreamEvent) -> bool:
        """Queue or write through `event`; True when it woke the parked relay (it has work now)."""
        if self.finished:
            return False
        if isinstance(event, ChunkEv):
            sink, waiter = self.sink, self._waiter
            if sink is not None and waiter is not None and not self._events and sink(event.delta):
                # Written through: the relay stays parked; output moved its idle deadline on.
                self._deadline = waiter.get_loop().time() + self._wait_s
                return False
            if len(self._events) >= self._limit:
                self.finished = True
                event = LostEv(LostReason.RELAY_OVERFLOW)
        else:
            self.finished = True
        self._events.append(event)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
            return True
        return False

    async def next(self, wait_s: float) -> StreamEvent | None:
        """The next event, or None when `wait_s` passed without one."""
        if self._events:
            return self._events.popleft()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        self._deadline = deadline
        self._wait_s = wait_s
        timer = self._timer
        if timer is None or timer.when() > deadline + _EARLY_S:
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(deadline, self._on_timer)
        waiter = loop.create_future()
        self._waiter = waiter
        try:
            await waiter
        finally:
            self._waiter = None
        return self._events.popleft() if self._events else None

    def take_chunks(self) -> list[str]:
        """Every chunk already queued (up to the first non-chunk event), without waiting."""
        events = self._events
        deltas: list[str] = []
        while events:
            ev = events[0]
            if not isinstance(ev, ChunkEv):
                break
            events.popleft()
            deltas.append(ev.delta)
        return deltas

    def close(self) -> None:
        """The relay is done with the stream: drop its timer (it would pin the stream)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # nobody waits: the next `next()` arms a timer for its own deadline
        loop = waiter.get_loop()
        if loop.time() + _EARLY_S < self._deadline:
            # Armed for an earlier deadline that chunks have since pushed back.
            self._timer = loop.call_at(self._deadline, self._on_timer)
            return
        waiter.set_result(None)
