"""A minimal HTTP/1.1 client over `asyncio.Protocol` and httptools, for the platform's two
streaming calls: the gateway's dispatch to an orchestrator and the agent's call to its engine.

Only what those calls need, on the fewest microseconds per request and per chunk: one
`transport.write` per request, a keep-alive pool per origin (LIFO idle list), the response head
parsed before `request()` returns, the body handed to one consumer as the pieces arrive (chunked
framing decoded by httptools; no re-splitting, no copies) with read flow control.

Connection rules: a connection goes back to the idle pool only when the message ended, the server
allows keep-alive and the consumer read the whole body; anything else (an early `aclose()`, a parse
error, a loss mid-body, `Connection: close`) closes it, so closing early is how the upstream learns
that the client left. A pooled connection that turns out closed before any response byte arrived
(the server timed it out while idle) is retried once on a fresh connection: nothing ran. Once a
response byte arrived, nothing is retried. One connection and its exchange: `http_conn.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from apps.netio.http_conn import HIGH_WATER, LOW_WATER, HttpConnection, _NoResponse

__all__ = ["HIGH_WATER", "HostPool", "HttpConnection", "HttpResponse", "Unreachable"]

CONNECT_TIMEOUT_S = 5.0
# Like aiohttp's keepalive_timeout: drop our idle connections before the server (aiohttp: 75 s) does,
# which keeps the stale-connection race (and its retry) rare.
IDLE_TIMEOUT_S = 15.0


class Unreachable(ConnectionError):
    """The origin refused or timed out the connection, or closed a fresh connection before any
    response byte: the request did not run there."""


class HttpResponse:
    """One response: status and lower-cased headers known, the body read with `chunks()` (the
    object is its own iterator) or `read_body()`. Satisfies the gateway's `Upstream` Protocol."""

    __slots__ = ("_conn", "_error", "_pool", "headers", "status")

    def __init__(self, conn: HttpConnection, pool: HostPool) -> None:
        self._conn: HttpConnection | None = conn
        self._pool = pool
        self._error: ConnectionError | None = None
        self.status = conn.status
        self.headers: Mapping[str, str] = conn.headers

    def chunks(self) -> HttpResponse:
        return self

    def set_sink(self, sink: Callable[[bytes], bool] | None) -> None:
        """Offer each body piece to `sink` from `data_received` while the consumer waits in `chunks()`
        with none queued: a piece it takes (returns True) never comes out of `chunks()`, one it
        declines does, in order (the relay writes pieces straight to the client socket this way:
        `apps.netio.uvicorn_writer`). `None` stops it. A sink that raises is dropped (logged once per
        response); its piece and every later one come out of `chunks()`."""
        if self._conn is not None:
            self._conn.sink = sink

    def __aiter__(self) -> HttpResponse:
        return self

    async def __anext__(self) -> bytes:
        # The relay's per-chunk path: a buffered piece is returned without a future or a lookup.
        conn = self._conn
        while conn is not None:
            buf = conn.buf
            if buf:
                data = buf.popleft()
                conn.buffered -= len(data)
                if conn.paused and conn.buffered <= LOW_WATER:
                    conn.resume()
                return data
            if conn.error is not None:
                self._error = conn.error
                self._finish(conn, reuse=False)
                break
            if conn.complete:
                self._finish(conn, reuse=True)
                break
            waiter = conn.waiter = conn.loop.create_future()
            await waiter
        if self._error is not None:
            raise ConnectionError(*self._error.args)
        raise StopAsyncIteration

    async def readany(self) -> bytes:
        """Everything buffered now as one piece (waits for the first); b"" at the end of the body.
        A consumer that falls behind thus catches up in one step per wake-up, not one per piece
        (the agent turns each of these into one `chunk` frame)."""
        try:
            first = await self.__anext__()
        except StopAsyncIteration:
            return b""
        return self._take(first)

    def take_buffered(self) -> bytes:
        """Every body piece received so far, joined, without waiting (b"" when none): the relay
        writes the first chunk, which came with the head, straight from the task the head woke."""
        return self._take(b"")

    def _take(self, first: bytes) -> bytes:
        """`first` followed by everything buffered, in one join (no copy when nothing is buffered)."""
        conn = self._conn
        if conn is None or not conn.buf:
            return first
        buf = conn.buf
        parts = [first] if first else []
        parts.extend(buf.popleft() for _ in range(len(buf)))
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        conn.buffered = 0
        if conn.paused:
            conn.resume()
        return data

    async def read_body(self) -> bytes:
        return b"".join([data async for data in self])

    async def aclose(self) -> None:
        """Before the consumer read the whole body this drops the connection: the server sees the
        disconnect (the orchestrator cancels the request on the node)."""
        conn = self._conn
        if conn is not None:
            self._finish(conn, reuse=False)

    def _finish(self, conn: HttpConnection, *, reuse: bool) -> None:
        self._conn = None
        self._pool.release(conn, reuse=reuse)


class HostPool:
    """Keep-alive connections to one `http://host[:port]` origin, at most `limit` in use at a time
    (`slots`, when given, is a limit shared with other pools: aiohttp's connector-wide limit)."""

    def __init__(
        self,
        url: str,
        *,
        limit: int = 2000,
        slots: asyncio.Semaphore | None = None,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"only http(s)://host[:port] upstream URLs are supported, got {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        # https: the given context, else the system's default (certificate and host name checked).
        self._ssl: ssl.SSLContext | None = (
            (ssl_context or ssl.create_default_context()) if parts.scheme == "https" else None
        )
        self.base_path = parts.path.rstrip("/")
        self._host_header = parts.netloc.rsplit("@", 1)[-1]
        self._limit = limit
        self._slots = slots if slots is not None else asyncio.Semaphore(limit)
        self._connect_timeout_s = connect_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self._idle: list[HttpConnection] = []
        self._conns: set[HttpConnection] = set()
        self._closed = False

    def head(self, method: str, path: str, headers: Mapping[str, str]) -> bytes:
        """The request head up to the `Content-Length` value (a caller sending many requests with the
        same headers encodes this once); `Host` and `Content-Length` are ours, not from `headers`."""
        for text in (method, path, *headers.keys(), *headers.values()):
            if "\r" in text or "\n" in text:
                raise ValueError("CR or LF inside a request line or header")
        lines = [f"{method} {path} HTTP/1.1\r\nHost: {self._host_header}\r\n"]
        lines += [f"{name}: {value}\r\n" for name, value in headers.items()]
        lines.append("Content-Length: ")
        return "".join(lines).encode("latin-1")

    async def request(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> HttpResponse:
        """Send one request; return once the status line and headers arrived. Raises `Unreachable`
        when the request surely did not run here, `ConnectionError` when the response broke off."""
        return await self.send(self.head(method, path, headers), body)

    async def send(self, head: bytes, body: bytes) -> HttpResponse:
        """`request` with the head already encoded by `head()`; the request goes out in one write."""
        if self._closed:
            raise Unreachable("the pool is closed")
        data = b"%b%d\r\n\r\n%b" % (head, len(body), body)
        await self._slots.acquire()
        try:
            conn = self._pop_idle()
            if conn is not None:
                try:
                    await conn.exchange(data)
                    return HttpResponse(conn, self)
                except _NoResponse:
                    pass  # the server closed it while idle: nothing ran, retry once on a fresh one
            conn = await self._connect()
            try:
                await conn.exchange(data)
            except _NoResponse:
                raise Unreachable(f"{self._host_header} closed the connection before answering") from None
            return HttpResponse(conn, self)
        except BaseException:
            self._slots.release()
            raise

    def _pop_idle(self) -> HttpConnection | None:
        idle = self._idle
        while idle:
            conn = idle.pop()
            conn.in_pool = False
            if conn.closed:
                continue
            if conn.loop.time() - conn.idle_since > self._idle_timeout_s:
                # LIFO: every connection below this one has been idle even longer.
                conn.close()
                for old in idle:
                    old.in_pool = False
                    old.close()
                idle.clear()
                return None
            return conn
        return None

    async def _connect(self) -> HttpConnection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: HttpConnection(self, loop), self.host, self.port, ssl=self._ssl
                )
        except (OSError, TimeoutError) as exc:
            raise Unreachable(f"{self._host_header}: {exc!r}") from exc
        self._conns.add(conn)
        return conn

    def release(self, conn: HttpConnection, *, reuse: bool) -> None:
        """The exchange on `conn` is over: back to the idle list, or closed."""
        self._slots.release()
        if (
            reuse
            and conn.keep_alive
            and not conn.closed
            and not self._closed
            and len(self._idle) < self._limit
        ):
            conn.make_idle()
            conn.idle_since = conn.loop.time()
            conn.in_pool = True
            self._idle.append(conn)
        else:
            conn.close()

    def forget(self, conn: HttpConnection) -> None:
        """`conn` is gone (called from `connection_lost`)."""
        self._conns.discard(conn)
        if conn.in_pool:
            conn.in_pool = False
            with contextlib.suppress(ValueError):
                self._idle.remove(conn)

    def drop_idle(self) -> None:
        """Close the kept-alive connections (the next request opens a fresh one: behind a Service
        address, to whichever replica is ready now)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.in_pool = False
            conn.close()

    async def aclose(self) -> None:
        """Close every connection (a response still being read then fails with `ConnectionError`)."""
        self._closed = True
        self._idle.clear()
        conns = list(self._conns)
        for conn in conns:
            conn.in_pool = False
            conn.close()
        if conns:
            await asyncio.wait([c.lost for c in conns], timeout=1.0)
