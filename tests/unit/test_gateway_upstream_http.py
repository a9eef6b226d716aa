"""The raw-protocol upstream client (`apps.netio.http_client`) and the dispatcher on top of it,
against small raw asyncio HTTP servers on loopback that script each exchange byte for byte."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from apps.cli.procs import free_port as closed_port
from apps.core.protocol.dispatch import DISPATCH_PATH, DispatchRequest
from apps.gateway.dispatcher import HttpDispatcher
from apps.gateway.ports import DispatchUnavailable
from apps.netio.http_client import HIGH_WATER, HostPool, Unreachable
from tests.fakes.raw_http_server import (
    HEAD_CHUNKED,
    PIECES,
    Conn,
    Request,
    chunk,
    get,
    poll_until,
    raw_pool,
    raw_server,
    read_acked,
    streaming,
)


async def test_chunked_body_arrives_piecewise_and_byte_identical() -> None:
    acks: asyncio.Queue[None] = asyncio.Queue()

    async def lockstep(req: Request, conn: Conn) -> bool:
        conn.writer.write(HEAD_CHUNKED)
        for piece in PIECES:  # one piece per write, the next only once the client got this one
            conn.writer.write(chunk(piece))
            await acks.get()
        conn.writer.write(b"0\r\n\r\n")
        return True

    async with raw_pool(lockstep) as (server, pool):
        response = await get(pool, b'{"a":1}')
        assert response.status == 200
        assert response.headers["content-type"] == "text/event-stream"
        got = await read_acked(response, acks)
    assert got == PIECES
    head = server.requests[0].head
    assert head.startswith(b"POST /x HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer t\r\n" in head
    assert b"\r\nContent-Length: 7\r\n" in head
    assert server.requests[0].body == b'{"a":1}'


async def test_readany_returns_every_piece_buffered_so_far_as_one() -> None:
    """The agent's read: pieces that piled up while it was busy come back in one step (one
    `chunk` frame), not one per piece, so a consumer that falls behind catches up."""
    sent = asyncio.Event()
    release = asyncio.Event()

    async def burst(req: Request, conn: Conn) -> bool:
        conn.writer.write(HEAD_CHUNKED + chunk(PIECES[0]))
        await release.wait()
        conn.writer.write(b"".join(chunk(p) for p in PIECES[1:]) + b"0\r\n\r\n")  # two pieces, one write
        await conn.writer.drain()
        sent.set()
        return True

    async with raw_pool(burst) as (_, pool):
        response = await get(pool, b"{}")
        assert await response.readany() == PIECES[0]
        release.set()
        await sent.wait()
        await poll_until(lambda: len(response._conn.buf) == 2 if response._conn else False)  # type: ignore[attr-defined]
        assert await response.readany() == b"".join(PIECES[1:])
        assert await response.readany() == b""  # the end of the body
        assert await response.readany() == b""


async def test_take_buffered_returns_what_came_with_the_head_without_waiting() -> None:
    """The gateway's relay writes the first chunk from the task the head woke: what arrived in the
    same read as the head is there at once, taken in one piece, and the stream goes on after it."""
    release = asyncio.Event()

    async def head_with_chunk(req: Request, conn: Conn) -> bool:
        conn.writer.write(HEAD_CHUNKED + chunk(PIECES[0]) + chunk(PIECES[1]))  # one write: one read
        await release.wait()
        conn.writer.write(chunk(PIECES[2]) + b"0\r\n\r\n")
        return True

    async with raw_pool(head_with_chunk) as (_, pool):
        response = await get(pool, b"{}")
        await poll_until(lambda: len(response._conn.buf) == 2 if response._conn else False)  # type: ignore[attr-defined]
        assert response.take_buffered() == PIECES[0] + PIECES[1]
        assert response.take_buffered() == b""  # nothing more yet, and no wait
        release.set()
        assert b"".join([d async for d in response.chunks()]) == PIECES[2]
        assert response.take_buffered() == b""  # finished: the connection went back to the pool


async def test_content_length_body_and_keep_alive_reuse() -> None:
    body = b'{"error":{"message":"no node"}}'

    async def answer(req: Request, conn: Conn) -> bool:
        head = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 3\r\nContent-Length: %d\r\n\r\n" % len(body)
        conn.writer.write(head + body[:10])
        await conn.writer.drain()
        conn.writer.write(body[10:])
        return True

    async with raw_pool(answer) as (server, pool):
        first = await get(pool)
        assert (first.status, first.headers["retry-after"]) == (503, "3")
        assert await first.read_body() == body
        await first.aclose()
        second = await get(pool)
        assert b"".join([d async for d in second.chunks()]) == body
        await second.aclose()
    assert [r.conn for r in server.requests] == [1, 1]  # two sequential requests, one connection
    assert len(server.conns) == 1


async def test_early_aclose_drops_the_connection_and_it_is_not_reused() -> None:
    seen_gone = asyncio.Event()

    async def endless(req: Request, conn: Conn) -> bool:
        if req.conn == 2:
            return await streaming(req, conn)
        conn.writer.write(HEAD_CHUNKED + chunk(PIECES[0]))  # ... and the rest never comes
        await conn.wait_disconnect()
        seen_gone.set()
        return False

    async with raw_pool(endless) as (server, pool):
        response = await get(pool)
        assert await anext(response.chunks()) == PIECES[0]
        await response.aclose()
        async with asyncio.timeout(10):
            await seen_gone.wait()  # the server saw the disconnect: the orchestrator cancels
        again = await get(pool)
        assert await again.read_body() == b"".join(PIECES)
    assert [r.conn for r in server.requests] == [1, 2]


@pytest.mark.parametrize("framing", ["chunked", "content-length"])
async def test_connection_lost_mid_body_is_a_connection_error(framing: str) -> None:
    async def dies(req: Request, conn: Conn) -> bool:
        if framing == "chunked":
            conn.writer.write(HEAD_CHUNKED + chunk(PIECES[0]))
        else:
            conn.writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + PIECES[0])
        await conn.writer.drain()
        return False  # the server closes the connection mid-body

    async with raw_pool(dies) as (_, pool):
        response = await get(pool)
        chunks = response.chunks()
        assert await anext(chunks) == PIECES[0]
        with pytest.raises(ConnectionError):
            await anext(chunks)
        with pytest.raises(ConnectionError):  # and stays failed
            await anext(chunks)
        await response.aclose()


async def test_body_until_close_ends_cleanly_and_connection_close_is_honoured() -> None:
    async def close_delimited(req: Request, conn: Conn) -> bool:
        conn.writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + PIECES[0])
        await conn.writer.drain()
        return False

    async with raw_pool(close_delimited) as (server, pool):
        for _ in range(2):
            response = await get(pool)
            assert await response.read_body() == PIECES[0]
    assert [r.conn for r in server.requests] == [1, 2]


async def test_stale_pooled_connection_is_retried_once_on_a_fresh_one() -> None:
    async def idle_timeout(req: Request, conn: Conn) -> bool:
        if len(server.requests) == 2:
            return False  # closes the kept-alive connection instead of answering: nothing ran
        return await streaming(req, conn)

    async with raw_pool(idle_timeout) as (server, pool):
        first = await get(pool, b"1")
        assert await first.read_body() == b"".join(PIECES)
        second = await get(pool, b"2")
        assert await second.read_body() == b"".join(PIECES)
    assert [(r.conn, r.body) for r in server.requests] == [(1, b"1"), (1, b"2"), (2, b"2")]


async def test_stale_then_fresh_closed_is_unreachable_and_retried_only_once() -> None:
    async def closes_after_first(req: Request, conn: Conn) -> bool:
        return len(server.requests) == 1 and await streaming(req, conn)

    async with raw_pool(closes_after_first) as (server, pool):
        assert await (await get(pool)).read_body() == b"".join(PIECES)
        with pytest.raises(Unreachable):
            await get(pool)
    assert [r.conn for r in server.requests] == [1, 1, 2]


async def test_no_retry_once_a_response_byte_arrived() -> None:
    async def half_a_head(req: Request, conn: Conn) -> bool:
        if len(server.requests) == 1:
            return await streaming(req, conn)
        conn.writer.write(b"HTTP/1.1 200 OK\r\nContent-")
        await conn.writer.drain()
        return False

    async with raw_pool(half_a_head) as (server, pool):
        assert await (await get(pool)).read_body() == b"".join(PIECES)
        with pytest.raises(ConnectionError) as info:
            await get(pool)
        assert not isinstance(info.value, Unreachable)
    assert [r.conn for r in server.requests] == [1, 1]  # never sent again


async def test_malformed_response_is_a_connection_error_and_the_connection_is_dropped() -> None:
    gone = asyncio.Event()

    async def garbage(req: Request, conn: Conn) -> bool:
        conn.writer.write(HEAD_CHUNKED + b"zz\r\nnot a chunk\r\n")
        await conn.writer.drain()
        await conn.wait_disconnect()
        gone.set()
        return False

    async with raw_pool(garbage) as (server, pool):
        response = await get(pool)
        with pytest.raises(ConnectionError):
            await response.read_body()
        async with asyncio.timeout(10):
            await gone.wait()
    assert len(server.requests) == 1


async def test_flow_control_pauses_reading_and_resumes() -> None:
    total = 32 * 1024 * 1024  # far more than the high-water mark plus the kernel's socket buffers
    block = bytes(range(256)) * 256
    sent_all = asyncio.Event()
    writers: list[asyncio.StreamWriter] = []

    async def firehose(req: Request, conn: Conn) -> bool:
        writers.append(conn.writer)
        conn.writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        for _ in range(total // len(block)):
            conn.writer.write(block)
            await conn.writer.drain()
        sent_all.set()
        return True

    async with raw_pool(firehose) as (_, pool):
        response = await get(pool)
        conn = response._conn
        assert conn is not None
        await poll_until(lambda: conn.paused)
        # The client stopped reading: the server's own buffer fills and its drain() blocks.
        await poll_until(lambda: writers[0].transport.get_write_buffer_size() > 0)
        assert HIGH_WATER < conn.buffered <= HIGH_WATER + 512 * 1024
        assert not sent_all.is_set()
        received = 0
        async for data in response.chunks():
            received += len(data)
        assert conn.paused is False
        async with asyncio.timeout(10):
            await sent_all.wait()
    assert received == total


async def test_the_limit_bounds_connections_in_use() -> None:
    async def read(pool: HostPool) -> bytes:
        response = await get(pool)
        try:
            return await response.read_body()
        finally:
            await response.aclose()

    async with raw_pool(streaming, limit=1) as (server, pool):
        bodies = await asyncio.gather(*(read(pool) for _ in range(5)))
    assert bodies == [b"".join(PIECES)] * 5
    assert len(server.conns) == 1  # unbounded, the five would have opened five connections at once


def dispatch_request() -> DispatchRequest:
    return DispatchRequest(request_id="r-12345678", team_id=1, model="m", body={"messages": []})


async def test_dispatcher_skips_a_refusing_replica_and_none_reachable_is_unavailable() -> None:
    async with raw_server(streaming) as server:
        dead = f"http://127.0.0.1:{closed_port()}"
        dispatcher = HttpDispatcher([dead, server.url + "/"], "internal")
        try:
            for _ in range(2):  # whichever replica the rotation starts with, the live one answers
                upstream = await dispatcher.open(dispatch_request())
                assert await upstream.read_body() == b"".join(PIECES)
                await upstream.aclose()
        finally:
            await dispatcher.aclose()
    assert len(server.requests) == 2
    assert server.requests[0].head.startswith(f"POST {DISPATCH_PATH} HTTP/1.1\r\n".encode())
    assert b"\r\nAuthorization: Bearer internal\r\n" in server.requests[0].head
    assert DispatchRequest.model_validate_json(server.requests[0].body) == dispatch_request()
    nobody = HttpDispatcher([dead, f"http://127.0.0.1:{closed_port()}"], "internal")
    try:
        with pytest.raises(DispatchUnavailable):
            await nobody.open(dispatch_request())
    finally:
        await nobody.aclose()


@pytest.mark.parametrize("url", ["orchestrator:8080", "ws://x", "ftp://orchestrator"])
def test_only_http_and_https_urls_are_accepted(url: str) -> None:
    with pytest.raises(ValueError, match=r"http\(s\)://"):
        HttpDispatcher([url], "internal")
    assert HostPool("https://orchestrator:8443").port == 8443  # TLS: tests/unit/test_agent_tls.py


def test_header_injection_is_refused() -> None:
    with pytest.raises(ValueError, match="CR or LF"):
        HttpDispatcher(["http://127.0.0.1:1"], "tok\r\nX-Evil: 1")


UVLOOP_SCENARIOS: list[Callable[[], Awaitable[None]]] = [
    test_chunked_body_arrives_piecewise_and_byte_identical,
    test_content_length_body_and_keep_alive_reuse,
    test_early_aclose_drops_the_connection_and_it_is_not_reused,
    lambda: test_connection_lost_mid_body_is_a_connection_error("chunked"),
    test_body_until_close_ends_cleanly_and_connection_close_is_honoured,
    test_stale_pooled_connection_is_retried_once_on_a_fresh_one,
    test_no_retry_once_a_response_byte_arrived,
    test_flow_control_pauses_reading_and_resumes,
    test_dispatcher_skips_a_refusing_replica_and_none_reachable_is_unavailable,
]


@pytest.mark.parametrize("scenario", UVLOOP_SCENARIOS, ids=lambda f: getattr(f, "__name__", "lost"))
def test_the_same_under_uvloop(scenario: Callable[[], Awaitable[None]]) -> None:
    """The gateway runs on uvloop, whose transports differ from the stdlib's (they do not subclass
    asyncio.Transport; writing to a closed one raises)."""
    uvloop = pytest.importorskip("uvloop")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario())  # type: ignore[arg-type]
