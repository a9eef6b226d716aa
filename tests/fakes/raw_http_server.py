"""Small raw asyncio HTTP/1.1 servers on loopback that script each exchange byte for byte, for the
tests of the gateway's upstream client (`apps.netio.http_client`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from apps.netio.http_client import HostPool, HttpResponse

HEAD_CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
PIECES = [b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n', b"data: \r\n0\r\n\n\n", b"data: [DONE]\n\n"]


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


@dataclass
class Request:
    head: bytes
    body: bytes
    conn: int  # which server-side connection (1, 2, ...) it came on


@dataclass
class Conn:
    number: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def wait_disconnect(self) -> None:
        """Returns when the client closed the connection (EOF or reset)."""
        with contextlib.suppress(ConnectionError):
            while await self.reader.read(65536):
                pass


Handler = Callable[[Request, Conn], Awaitable[bool]]  # True: keep the connection for the next request


@dataclass
class RawServer:
    handler: Handler
    requests: list[Request] = field(default_factory=list)
    conns: list[Conn] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Conn(len(self.conns) + 1, reader, writer)
        self.conns.append(conn)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the client closed the connection
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                req = Request(head, await reader.readexactly(length), conn.number)
                self.requests.append(req)
                if not await self.handler(req, conn):
                    return
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[RawServer]:
    server = RawServer(handler)
    listener = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    server.port = listener.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        listener.close()
        for conn in server.conns:
            conn.writer.close()
        await listener.wait_closed()


@contextlib.asynccontextmanager
async def raw_pool(handler: Handler, limit: int | None = None) -> AsyncIterator[tuple[RawServer, HostPool]]:
    """`raw_server(handler)` and a `HostPool` to it (with `limit` connections if given), closed after."""
    async with raw_server(handler) as server:
        pool = HostPool(server.url) if limit is None else HostPool(server.url, limit=limit)
        try:
            yield server, pool
        finally:
            await pool.aclose()


async def read_acked(response: HttpResponse, acks: asyncio.Queue[None]) -> list[bytes]:
    """Every piece of `response`'s body, one ack put on `acks` after each; then the response closed."""
    got = []
    async for data in response.chunks():
        got.append(data)
        acks.put_nowait(None)
    await response.aclose()
    return got


async def poll_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll with a deadline (for state that has no event to wait on)."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


async def streaming(req: Request, conn: Conn) -> bool:
    conn.writer.write(HEAD_CHUNKED + b"".join(chunk(p) for p in PIECES) + b"0\r\n\r\n")
    await conn.writer.drain()
    return True


async def get(pool: HostPool, body: bytes = b"{}") -> HttpResponse:
    return await pool.request("POST", "/x", {"Authorization": "Bearer t"}, body)
