"""The relay's hot path: one timer per stream (not per chunk), deadlines never early,
and chunks that queued up behind one another written together."""

from __future__ import annotations

import asyncio

from apps.core.protocol.node import Done
from apps.orchestrator.streams import ChunkEv, DoneEv, RequestStream

GUARD_S = 10.0  # a broken deadline fails the test instead of hanging it


async def test_queued_chunks_are_taken_together_up_to_the_terminal_event() -> None:
    stream = RequestStream("r", "n", limit=8)
    for text in ("a", "b", "c"):
        stream.deliver(ChunkEv(text))
    stream.deliver(DoneEv(Done(request_id="r", prompt_tokens=1, completion_tokens=3)))
    assert await stream.next(1) == ChunkEv("a")
    assert stream.take_chunks() == ["b", "c"]
    assert stream.take_chunks() == []
    assert isinstance(await stream.next(1), DoneEv)


async def test_a_waiting_relay_is_woken_by_delivery() -> None:
    stream = RequestStream("r", "n", limit=8)
    waiter = asyncio.ensure_future(stream.next(GUARD_S))
    await asyncio.sleep(0)  # let it start waiting (no time passes: one loop turn)
    stream.deliver(ChunkEv("x"))
    async with asyncio.timeout(GUARD_S):
        assert await waiter == ChunkEv("x")


async def test_a_shorter_deadline_replaces_a_longer_timer() -> None:
    stream = RequestStream("r", "n", limit=8)
    waiter = asyncio.ensure_future(stream.next(1000.0))  # first-token phase: a far timer
    await asyncio.sleep(0)
    stream.deliver(ChunkEv("x"))
    assert await waiter == ChunkEv("x")
    async with asyncio.timeout(GUARD_S):
        assert await stream.next(0.01) is None  # idle phase: must not wait for the far timer
    stream.close()


async def test_a_pushed_back_deadline_is_never_cut_short_by_the_earlier_timer() -> None:
    loop = asyncio.get_running_loop()
    stream = RequestStream("r", "n", limit=8)
    waiter = asyncio.ensure_future(stream.next(0.02))  # arms the stream's timer at +20 ms
    await asyncio.sleep(0)
    stream.deliver(ChunkEv("x"))
    assert await waiter == ChunkEv("x")
    start = loop.time()
    async with asyncio.timeout(GUARD_S):
        assert await stream.next(0.2) is None  # the +20 ms timer fires first and re-arms
    assert loop.time() - start >= 0.2 - 0.002  # a lower bound: slowness cannot fail it
    stream.close()


async def test_close_drops_the_timer() -> None:
    stream = RequestStream("r", "n", limit=8)
    waiter = asyncio.ensure_future(stream.next(1000.0))
    await asyncio.sleep(0)
    stream.deliver(ChunkEv("x"))
    assert await waiter == ChunkEv("x")
    timer = stream._timer
    assert timer is not None  # left armed for the next `next()` to reuse
    stream.close()
    assert stream._timer is None
    assert timer.cancelled()  # nothing pins the stream for the next 1000 s


async def test_a_sink_takes_chunks_only_while_the_relay_waits_with_nothing_queued() -> None:
    stream = RequestStream("r", "n", limit=8)
    written: list[str] = []
    writable = True

    def sink(delta: str) -> bool:
        if writable:
            written.append(delta)
        return writable

    stream.sink = sink
    stream.deliver(ChunkEv("queued"))  # nobody waits: the relay may be busy writing; keep order
    assert written == []
    assert await stream.next(1) == ChunkEv("queued")
    waiter = asyncio.ensure_future(stream.next(GUARD_S))
    await asyncio.sleep(0)
    stream.deliver(ChunkEv("a"))
    stream.deliver(ChunkEv("b"))
    assert written == ["a", "b"]
    assert not waiter.done()  # written through: the relay was not woken
    writable = False  # the gateway's socket is backed up
    stream.deliver(ChunkEv("c"))
    stream.deliver(ChunkEv("d"))  # queued behind c, not offered
    assert await waiter == ChunkEv("c")
    writable = True
    assert stream.take_chunks() == ["d"]
    assert written == ["a", "b"]
    stream.close()


async def test_chunks_written_by_the_sink_keep_the_idle_deadline_moving() -> None:
    loop = asyncio.get_running_loop()
    stream = RequestStream("r", "n", limit=8)
    stream.sink = lambda delta: True
    start = loop.time()
    waiter = asyncio.ensure_future(stream.next(1.0))  # idle limit 1 s (a loaded machine stalls ~0.3 s)
    await asyncio.sleep(0)
    while loop.time() - start < 2.0:  # 2 s of output, every chunk written through
        stream.deliver(ChunkEv("x"))
        await asyncio.sleep(0.03)
        assert not waiter.done(), "idle timeout while output was flowing"
    stream.deliver(DoneEv(Done(request_id="r", prompt_tokens=1, completion_tokens=1)))
    async with asyncio.timeout(GUARD_S):
        assert isinstance(await waiter, DoneEv)
    stream.close()
