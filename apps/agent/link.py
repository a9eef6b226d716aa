"""The agent's link to the orchestrator: the connection state machine.

    wait for the engine → dial → register → serve → (lost) backoff → dial ...

One connection is served at a time by `serve`: a reader, the writer (`Connection.writer`) and the
host's `serving` work (heartbeats, journal replay) in one TaskGroup; when any of them ends, all
end. A registration refused with 4001 (an orchestrator older than this agent) is retried with
the next lower protocol version (3 -> 2 -> 1); the newest is tried again on the connection after. Refusals carry a retry
hint the backoff honours. What a frame means is the host's business (`LinkHost.handle`).

Handover (protocol version 3, docs/control-plane.md "Handover"): on `hand_over(conn)` the
connection being served *retires*: it goes on serving (its requests' chunks and `done`s, the
`done_ack`s and `cancel`s for them) in the background, and the loop dials at once, without
backoff, the next orchestrator URL (`--orchestrator-url` may list several, comma-separated; in
Kubernetes one Service URL, which no longer routes to the stopping replica, which also refuses
registrations). Each connection ends on its own: `LinkHost.on_connection_ended(conn)` aborts
only the requests that came on it.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Protocol

import aiohttp
from pydantic import ValidationError

from apps.agent.backoff import Backoff
from apps.agent.connection import Connection, ConnectionLost, RegistrationFailed, register
from apps.agent.health import AgentMetrics
from apps.agent.settings import AgentSettings
from apps.core.aio import first_of
from apps.core.protocol import node as proto

log = logging.getLogger("llmfleet.agent")

CLOSE_WAIT_S = 5.0  # the close handshake's bound


class LinkHost(Protocol):
    """What the link asks of the agent."""

    stopping: asyncio.Event

    async def wait_for_engine(self) -> bool: ...

    def register_frame(self, version: int) -> proto.Register: ...

    def on_registered(self, conn: Connection, ack: proto.RegisterAck) -> None: ...

    async def serving(self, conn: Connection) -> None: ...

    async def handle(self, conn: Connection, frame: proto.ServerFrame) -> None: ...

    def on_connection_ended(self, conn: Connection | None) -> None: ...

    async def pause(self, seconds: float) -> None: ...


class Link:
    def __init__(
        self,
        settings: AgentSettings,
        host: LinkHost,
        backoff: Backoff,
        metrics: AgentMetrics,
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        self.settings = settings
        self.host = host
        self.backoff = backoff
        self.metrics = metrics
        self._ssl_context = ssl_context
        self._version = proto.PROTOCOL_VERSION  # the next attempt's (one lower after a 4001)
        self.urls = [u.strip() for u in settings.orchestrator_url.split(",") if u.strip()]
        self._url = 0  # index of the next attempt's URL (moves on after a failure or a handover)
        self.current: Connection | None = None  # the connection being served by the loop
        self._handover = asyncio.Event()
        self._retiring: set[asyncio.Task[None]] = set()
        self._retiring_conns: set[Connection] = set()
        self._attempt_task: asyncio.Task[None] | None = None

    def hand_over(self, conn: Connection) -> bool:
        """The orchestrator of `conn` stops: serve it on in the background, register elsewhere."""
        if conn is not self.current or self.host.stopping.is_set():
            return False
        conn.retiring = True
        self._url += 1
        self._handover.set()
        return True

    @property
    def retiring(self) -> list[Connection]:
        return [c for c in self._retiring_conns if not c.closed]

    def _ssl(self, url: str) -> ssl.SSLContext | bool:
        if not url.startswith("wss://"):
            return False
        if self._ssl_context is not None:
            return self._ssl_context
        cafile = str(self.settings.ca_bundle) if self.settings.ca_bundle else None
        return ssl.create_default_context(cafile=cafile)

    async def run(self) -> None:
        """Connect, serve, reconnect with backoff, until the host stops."""
        stopping = self.host.stopping
        async with aiohttp.ClientSession() as ws_session:
            try:
                await self._loop(ws_session, stopping)
            finally:
                if self._attempt_task is not None:
                    self._attempt_task.cancel()
                for task in list(self._retiring):
                    task.cancel()
                await asyncio.gather(*self._retiring, return_exceptions=True)
                if self._attempt_task is not None:
                    await asyncio.gather(self._attempt_task, return_exceptions=True)

    async def _loop(self, ws_session: aiohttp.ClientSession, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            if not await self.host.wait_for_engine():
                return
            retry_after: float | None = None
            version, self._version = self._version, proto.PROTOCOL_VERSION
            url = self.urls[self._url % len(self.urls)]
            self._handover.clear()
            attempt = asyncio.create_task(self._attempt(ws_session, url, version), name="agent-connection")
            self._attempt_task = attempt
            await first_of(asyncio.shield(attempt), self._handover.wait())
            if not attempt.done():
                self._retire(attempt)  # handed over: that connection ends on its own
                continue
            conn, self.current = self.current, None
            try:
                attempt.result()
            except RegistrationFailed as exc:
                retry_after = self._refused(exc, version)
            except ConnectionLost as exc:
                if stopping.is_set():
                    log.info("connection closed after drain")
                else:
                    log.warning("connection lost", extra={"reason": str(exc)})
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                self.metrics.connects.labels("failed").inc()
                log.warning("cannot reach the orchestrator", extra={"error": f"{type(exc).__name__}: {exc}"})
            finally:
                self.host.on_connection_ended(conn)
            if stopping.is_set():
                return
            if conn is None:
                self._url += 1  # not registered there: the next URL on the next attempt
            await self._back_off(retry_after)

    def _retire(self, attempt: asyncio.Task[None]) -> None:
        conn, self.current = self.current, None
        assert conn is not None
        self._retiring.add(attempt)
        self._retiring_conns.add(conn)

        def ended(task: asyncio.Task[None]) -> None:
            self._retiring.discard(task)
            self._retiring_conns.discard(conn)
            error = None if task.cancelled() else task.exception()
            log.info(
                "handed-over connection closed",
                extra={"close_code": conn.ws.close_code, "error": repr(error)},
            )
            self.host.on_connection_ended(conn)

        attempt.add_done_callback(ended)

    async def _attempt(self, ws_session: aiohttp.ClientSession, url: str, version: int) -> None:
        async with ws_session.ws_connect(
            url,
            ssl=self._ssl(url),
            heartbeat=self.settings.ws_ping_interval_s,
            timeout=aiohttp.ClientWSTimeout(ws_close=CLOSE_WAIT_S),
            max_msg_size=16 * 1024 * 1024,
        ) as ws:
            ack = await register(ws, self.host.register_frame(version), self.settings.register_timeout_s)
            if self.host.stopping.is_set():
                return  # drained (SIGTERM) while this registration was in flight
            self.metrics.connects.labels("registered").inc()
            self.backoff.reset()
            await self.serve(ws, ack, version=version)

    def _refused(self, exc: RegistrationFailed, version: int) -> float | None:
        self.metrics.connects.labels("refused").inc()
        if exc.close_code == proto.CLOSE_UNSUPPORTED_VERSION and version > 1:
            # An orchestrator older than this agent: one version lower on the next attempt (3 -> 2:
            # no handover; 2 -> 1: no batched messages either); the newest is tried again after.
            self._version = version - 1
        log.warning(
            "registration failed",
            extra={"reason": exc.reason, "close_code": exc.close_code, "retry_after_s": exc.retry_after_s},
        )
        return exc.retry_after_s

    async def _back_off(self, retry_after: float | None) -> None:
        window = self.backoff.window()  # the bound before jitter (doubles per attempt)
        delay = self.backoff.next_delay(retry_after)
        log.info(
            "reconnecting",
            extra={
                "delay_s": round(delay, 3),
                "window_s": round(window, 3),
                "retry_after_s": retry_after,
                "attempt": self.backoff.attempt,
            },
        )
        await self.host.pause(delay)

    async def serve(
        self, ws: aiohttp.ClientWebSocketResponse, ack: proto.RegisterAck, *, version: int
    ) -> None:
        batching = version >= proto.BATCHING_VERSION
        conn = Connection(ws, self.settings.send_queue_size, batching=batching, version=version)
        self.current = conn
        self.host.on_registered(conn, ack)
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(conn.writer(), name="agent-writer")
                tg.create_task(self._reader(conn), name="agent-reader")
                tg.create_task(self.host.serving(conn), name="agent-heartbeat")
        except* (ConnectionLost, aiohttp.ClientError, ConnectionError) as group:
            first = group.exceptions[0]
            raise (
                first if isinstance(first, ConnectionLost) else ConnectionLost(ws.close_code, str(first))
            ) from None
        finally:
            conn.close()

    async def _reader(self, conn: Connection) -> None:
        async for msg in conn.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            for text in proto.split_frames(msg.data):  # one frame, or (version 2) a batch
                try:
                    frame = proto.decode_server_frame(text)
                except ValidationError:
                    log.warning("ignoring an unreadable frame from the orchestrator")
                    continue
                await self.host.handle(conn, frame)
        raise ConnectionLost(conn.ws.close_code, "closed by the orchestrator")
