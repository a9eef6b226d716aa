"""The agent's link to the orchestrator: the connection state machine.

    wait for the engine → dial → register → serve → (lost) backoff → dial ...

One connection is served at a time by `serve`: a reader, the writer (`Connection.writer`) and the
host's `serving` work (heartbeats, journal replay) in one TaskGroup; when any of them ends, all
end. A registration refused with 4001 (an orchestrator older than this agent) is retried with
the next lower protocol version (3 -> 2 -> 1); the newest is tried again on the connection after. Refusals carry a retry
hint the backoff honours. What a frame means is the host's business (`LinkHost.handle`).
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

    def on_connection_ended(self) -> None: ...

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

    def _ssl(self) -> ssl.SSLContext | bool:
        if not self.settings.orchestrator_url.startswith("wss://"):
            return False
        if self._ssl_context is not None:
            return self._ssl_context
        cafile = str(self.settings.ca_bundle) if self.settings.ca_bundle else None
        return ssl.create_default_context(cafile=cafile)

    async def run(self) -> None:
        """Connect, serve, reconnect with backoff, until the host stops."""
        stopping = self.host.stopping
        ssl_ctx = self._ssl()
        async with aiohttp.ClientSession() as ws_session:
            while not stopping.is_set():
                if not await self.host.wait_for_engine():
                    return
                retry_after: float | None = None
                version, self._version = self._version, proto.PROTOCOL_VERSION
                try:
                    await self._attempt(ws_session, ssl_ctx, version)
                except RegistrationFailed as exc:
                    retry_after = self._refused(exc, version)
                except ConnectionLost as exc:
                    if stopping.is_set():
                        log.info("connection closed after drain")
                    else:
                        log.warning("connection lost", extra={"reason": str(exc)})
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    self.metrics.connects.labels("failed").inc()
                    log.warning(
                        "cannot reach the orchestrator", extra={"error": f"{type(exc).__name__}: {exc}"}
                    )
                finally:
                    self.host.on_connection_ended()
                if stopping.is_set():
                    return
                await self._back_off(retry_after)

    async def _attempt(
        self, ws_session: aiohttp.ClientSession, ssl_ctx: ssl.SSLContext | bool, version: int
    ) -> None:
        async with ws_session.ws_connect(
            self.settings.orchestrator_url,
            ssl=ssl_ctx,
            heartbeat=self.settings.ws_ping_interval_s,
            timeout=aiohttp.ClientWSTimeout(ws_close=CLOSE_WAIT_S),
            max_msg_size=16 * 1024 * 1024,
        ) as ws:
            ack = await register(ws, self.host.register_frame(version), self.settings.register_timeout_s)
            if self.host.stopping.is_set():
                return  # drained (SIGTERM) while this registration was in flight
            self.metrics.connects.labels("registered").inc()
            self.backoff.reset()
            await self.serve(ws, ack, batching=version >= proto.BATCHING_VERSION)

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
        self, ws: aiohttp.ClientWebSocketResponse, ack: proto.RegisterAck, *, batching: bool
    ) -> None:
        conn = Connection(ws, self.settings.send_queue_size, batching=batching)
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
