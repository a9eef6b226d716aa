"""Where the agent's frames go: the live connection to the orchestrator (`Outlet`).

The relays and the work table send through it (`apps.agent.work.Outlet`, `relay.ChunkSink`);
with no live connection a chunk or an error is dropped (the orchestrator has treated the request
as failed already) and a `done` waits in the journal, replayed on the next connection and resent
while it stays unacknowledged.
"""

from __future__ import annotations

import asyncio

from apps.agent.connection import Connection
from apps.agent.health import AgentMetrics
from apps.agent.journal import Journal
from apps.core.protocol import node as proto


class BoundOutlet:
    """One request's outlet: the connection its `assign` came on. After a handover its chunks
    keep going there (not to the new live connection) until it ends; its `done` goes there too
    while that socket is open, else to the live one (and it is in the journal in any case)."""

    __slots__ = ("_conn", "_live")

    def __init__(self, conn: Connection, live: Outlet) -> None:
        self._conn = conn
        self._live = live

    @property
    def conn(self) -> Connection:
        return self._conn

    async def send_chunk(self, frame: proto.Chunk, *, first: bool = False) -> None:
        await self._live.send_chunk(frame, first=first, conn=self._conn)

    async def send_done(self, frame: proto.Done) -> None:
        if self._conn.closed:
            await self._live.send_done(frame)
        else:
            await self._live.send_done_on(self._conn, frame)

    async def send_error(self, frame: proto.Error) -> None:
        if not self._conn.closed:
            await self._conn.send(frame)


class Outlet:
    def __init__(self, journal: Journal, metrics: AgentMetrics, done_resend_s: float) -> None:
        self.conn: Connection | None = None  # the live connection (None between connections)
        self._journal = journal
        self._metrics = metrics
        self._done_resend_s = done_resend_s
        self._done_sent_at: dict[str, float] = {}

    def bound(self, conn: Connection) -> BoundOutlet:
        return BoundOutlet(conn, self)

    async def send_chunk(
        self, frame: proto.Chunk, *, first: bool = False, conn: Connection | None = None
    ) -> None:
        """To `conn` (default: the live connection), dropped when there is none. A request's
        first chunk is urgent (it leads its batch)."""
        conn = conn or self.conn
        if conn is not None:
            await conn.send(frame, urgent=first)

    async def send_done(self, frame: proto.Done) -> None:
        conn = self.conn
        if conn is not None:
            await self.send_done_on(conn, frame)

    async def send_error(self, frame: proto.Error) -> None:
        conn = self.conn
        if conn is not None:
            await conn.send(frame)

    async def send_done_on(self, conn: Connection, done: proto.Done) -> None:
        self._done_sent_at[done.request_id] = asyncio.get_running_loop().time()
        if conn.version < proto.KV_EVENTS_VERSION and done.cached_tokens is not None:
            done = done.model_copy(update={"cached_tokens": None})  # a version 1-4 replica refuses it
        await conn.send(done)

    def acked(self, request_id: str) -> None:
        self._done_sent_at.pop(request_id, None)

    async def replay_journal(self, conn: Connection) -> None:
        """Every unacknowledged `done`, on a new connection."""
        for done in self._journal.pending():
            await self.send_done_on(conn, done)

    async def resend_unacked(self, conn: Connection) -> None:
        """The `done`s unacknowledged for `done_resend_s` (or never sent), again."""
        now = asyncio.get_running_loop().time()
        for done in self._journal.pending():
            sent = self._done_sent_at.get(done.request_id)
            if sent is None or now - sent >= self._done_resend_s:
                await self.send_done_on(conn, done)
