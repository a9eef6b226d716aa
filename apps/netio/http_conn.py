"""One HTTP/1.1 connection over `asyncio.Protocol` and httptools: the state of its current exchange
and the response's body buffer with read flow control (`http_client.HostPool` drives it)."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import httptools

if TYPE_CHECKING:
    from apps.netio.http_client import HostPool

log = logging.getLogger("llmfleet.netio.http_client")

HIGH_WATER = 256 * 1024  # buffered body bytes above which the socket is not read any more
LOW_WATER = 64 * 1024  # ... and below which reading resumes


class _NoResponse(Exception):
    """The connection closed before any response byte (internal: retry or `Unreachable`)."""


class HttpConnection(asyncio.Protocol):
    """One TCP connection and the state of its current exchange (at most one at a time)."""

    def __init__(self, pool: HostPool, loop: asyncio.AbstractEventLoop) -> None:
        self._pool = pool
        self.loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.lost: asyncio.Future[None] = loop.create_future()
        self.closed = False
        self.in_pool = False
        self.idle_since = 0.0
        self._active = False
        self._head: asyncio.Future[None] | None = None
        self._reset()

    def _reset(self) -> None:
        self._got_bytes = False
        self._head_done = False
        self._interim = False
        self._until_eof = False
        self.status = 0
        self.headers: dict[str, str] = {}
        self.buf: deque[bytes] = deque()
        self.buffered = 0
        self.waiter: asyncio.Future[None] | None = None
        self.complete = False
        self.keep_alive = False
        self.error: ConnectionError | None = None
        self.paused = False
        self.sink: Callable[[bytes], bool] | None = None

    # -- the exchange, driven by the pool and the response ---------------------------------------

    async def exchange(self, data: bytes) -> None:
        """Send one request; return once the response head is parsed (`status`, `headers`)."""
        transport = self.transport
        if self.closed or transport is None or transport.is_closing():
            raise _NoResponse
        self._reset()
        self._active = True
        head = self._head = self.loop.create_future()
        try:
            transport.write(data)
        except (RuntimeError, OSError):  # uvloop raises on a transport closed under us
            self.close()
            raise _NoResponse from None
        try:
            await head
        except asyncio.CancelledError:
            self.close()  # the caller gave up: dropping the connection tells the server
            raise
        finally:
            self._head = None
        if self._head_done:
            return
        self.close()
        if not self._got_bytes:
            raise _NoResponse
        raise self.error or ConnectionError("upstream closed the connection")

    def resume(self) -> None:
        self.paused = False
        transport = self.transport
        if transport is not None and not self.closed and not transport.is_closing():
            transport.resume_reading()

    def make_idle(self) -> None:
        self._active = False
        if self.paused:
            self.resume()
        self._reset()

    def close(self) -> None:
        self.keep_alive = False
        if self.transport is not None:
            self.transport.close()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _wake_head(self) -> None:
        head = self._head
        if head is not None and not head.done():
            head.set_result(None)

    def _fail(self, error: ConnectionError) -> None:
        self.keep_alive = False
        if self.complete:
            return  # the body is whole: only the connection is unusable
        if self.error is None:
            self.error = error
        self._wake()
        self._wake_head()

    # -- asyncio.Protocol ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        if not self._active:  # bytes on an idle connection: not a server we can reuse
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"malformed upstream response: {exc}"))
            self.close()

    def eof_received(self) -> bool | None:
        return None  # close our side too; `connection_lost` settles the exchange

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.keep_alive = False
        if not self.lost.done():
            self.lost.set_result(None)
        self._pool.forget(self)
        if not self._active:
            return
        if self._head_done and self._until_eof and exc is None and not self.complete:
            self.complete = True  # a body delimited by the end of the connection
            self._wake()
            return
        reason = f": {exc}" if exc is not None else ""
        self._fail(ConnectionError(f"upstream connection lost{reason}"))

    # -- httptools callbacks (an exception here aborts `feed_data` with HttpParserCallbackError) ------

    def on_message_begin(self) -> None:
        if self.complete:  # a second response to one request: never reuse this connection
            self.keep_alive = False
            raise httptools.HttpParserCallbackError("unexpected response")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # an interim response (100 Continue): wait for the real one
            self._interim = True
            self.headers = {}
            return
        self.status = status
        self.keep_alive = self._parser.should_keep_alive()
        headers = self.headers
        self._until_eof = (
            "content-length" not in headers
            and "chunked" not in headers.get("transfer-encoding", "").lower()
            and status not in (204, 304)
        )
        self._head_done = True
        self._wake_head()

    def on_body(self, body: bytes) -> None:
        sink = self.sink
        # Only while the consumer is parked waiting (a `waiter` exists) with nothing queued: a consumer
        # that is busy may hold a piece it has not written yet (e.g. waiting for the client's socket
        # to drain), and a piece written past it would overtake it.
        if sink is not None and self.waiter is not None and not self.buf:
            try:
                if sink(body):
                    return
            except Exception:
                self.sink = None  # a failing sink is dropped; its piece and the rest go to `chunks()`
                log.warning("body sink failed; falling back to the consumer's reads", exc_info=True)
        self.buf.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        waiter = self.waiter  # `_wake`, inlined: this runs once per body piece
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self.complete = True
        self._wake()
