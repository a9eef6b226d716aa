"""One relayed request as seen by the replica that took the dispatch: a bounded event queue.

Events come from the node's reader task (local node) or from the pub/sub reader (node
owned by another replica). Delivery never blocks those readers: the queue holds at most
`limit` events plus one slot kept for the terminal event; a relay that falls that far
behind gets `Lost("relay_overflow")` and is cancelled on the node, so one slow gateway
connection cannot stall every other stream of the node.
"""

from __future__ import annotations

import asyncio
import enum
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


class RequestStream:
    def __init__(self, request_id: str, node_id: str, limit: int) -> None:
        self.request_id = request_id
        self.node_id = node_id
        self._limit = limit
        self._queue: asyncio.Queue[StreamEvent] = asyncio.Queue(maxsize=limit + 1)
        self.finished = False  # a terminal event was delivered
        self.owner = ""  # for a node owned by another replica: that replica's id

    def deliver(self, event: StreamEvent) -> None:
        if self.finished:
            return
        if isinstance(event, ChunkEv):
            if self._queue.qsize() >= self._limit:
                self.finished = True
                self._queue.put_nowait(LostEv(LostReason.RELAY_OVERFLOW))
                return
            self._queue.put_nowait(event)
            return
        self.finished = True
        self._queue.put_nowait(event)

    async def next(self, wait_s: float) -> StreamEvent | None:
        """The next event, or None when `wait_s` passed without one."""
        try:
            return await asyncio.wait_for(self._queue.get(), wait_s)
        except TimeoutError:
            return None
