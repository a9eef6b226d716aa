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
from apps.netio import fastpath


class Outlet:
    def __init__(self, journal: Journal, metrics: AgentMetrics, done_resend_s: float) -> None:
        self.conn: Connection | None = None  # the live connection (None between connections)
        self._journal = journal
        self._metrics = metrics
        self._done_resend_s = done_resend_s
        self._done_sent_at: dict[str, float] = {}

    async def send_chunk(self, frame: proto.Chunk, *, first: bool = False) -> None:
        """To the live connection, dropped when there is none. A request's first chunk is urgent
        (it leads its batch)."""
        conn = self.conn
        if conn is not None:
            if first:
                self._metrics.netio.served(fastpath.AIOHTTP_WS_FRAME, fallback=1)
            await conn.send(frame, urgent=first)

    def send_first_now(self, frame: proto.Chunk) -> bool:
        """A request's first chunk straight onto the socket (from the engine socket's callback), or
        False when the live connection cannot take it synchronously now."""
        conn = self.conn
        if conn is None or not conn.send_now(frame):
            return False
        self._metrics.netio.served(fastpath.AIOHTTP_WS_FRAME, fast=1)
        return True

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
