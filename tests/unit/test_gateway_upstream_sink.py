"""The upstream client's sink (`HttpResponse.set_sink`): the relay's direct path to the client's
socket takes pieces only while the consumer waits with nothing queued, so order is always kept."""

from __future__ import annotations

import asyncio

import pytest

from apps.netio.http_client import HttpResponse
from tests.fakes.raw_http_server import HEAD_CHUNKED, Conn, Request, chunk, get, raw_pool, read_acked


async def test_a_sink_takes_pieces_in_order_and_declined_ones_come_out_of_chunks() -> None:
    pieces = [b"data: %d\n\n" % i for i in range(6)]
    acks: asyncio.Queue[None] = asyncio.Queue()

    async def lockstep(req: Request, conn: Conn) -> bool:
        conn.writer.write(HEAD_CHUNKED)
        await acks.get()  # the sink is set
        for piece in pieces:
            conn.writer.write(chunk(piece))
            await acks.get()
        conn.writer.write(b"0\r\n\r\n")
        return True

    taken: list[bytes] = []

    def sink(data: bytes) -> bool:
        if data == pieces[2]:
            return False  # e.g. the client is slow: this one goes through `chunks()`
        if data == pieces[4]:
            raise RuntimeError("a broken sink is dropped, not fatal")
        taken.append(data)
        acks.put_nowait(None)
        return True

    async with raw_pool(lockstep) as (server, pool):
        response = await get(pool)
        response.set_sink(sink)
        acks.put_nowait(None)
        got = await read_acked(response, acks)
    assert taken == [pieces[0], pieces[1], pieces[3]]
    assert got == [pieces[2], pieces[4], pieces[5]]
    assert len(server.requests) == 1


async def test_a_sink_is_not_offered_pieces_while_the_consumer_is_busy() -> None:
    """A consumer between two reads may still hold a piece it has not written (waiting for its
    client's socket to drain); a piece handed to the sink then would overtake it."""
    pieces = [b"data: %d\n\n" % i for i in range(3)]
    acks: asyncio.Queue[None] = asyncio.Queue()

    async def lockstep(req: Request, conn: Conn) -> bool:
        conn.writer.write(HEAD_CHUNKED)
        for piece in pieces:
            await acks.get()
            conn.writer.write(chunk(piece))
        await acks.get()
        conn.writer.write(b"0\r\n\r\n")
        return True

    taken: list[bytes] = []

    def sink(data: bytes) -> bool:
        taken.append(data)
        return True

    async def queued(response: HttpResponse, n: int) -> None:
        conn = response._conn
        assert conn is not None
        async with asyncio.timeout(10):
            while len(conn.buf) < n:
                await asyncio.sleep(0.001)

    async with raw_pool(lockstep) as (_, pool):
        response = await get(pool)
        response.set_sink(sink)
        it = response.chunks()
        acks.put_nowait(None)
        await queued(response, 1)  # nobody waiting in chunks(): queued, not sunk
        got = [await anext(it)]
        acks.put_nowait(None)  # the consumer is busy with piece 0 (not waiting)
        await queued(response, 1)
        assert taken == []
        got.append(await anext(it))
        waiting = asyncio.ensure_future(anext(it))  # now it waits: the next piece is sunk
        await asyncio.sleep(0)
        acks.put_nowait(None)
        acks.put_nowait(None)  # and the end of the body
        with pytest.raises(StopAsyncIteration):
            await waiting
        await response.aclose()
    assert got == pieces[:2]
    assert taken == [pieces[2]]
