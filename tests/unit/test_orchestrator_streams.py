"""RequestStream: bounded, never blocks the delivering reader, terminal event always fits."""

from __future__ import annotations

import asyncio

from apps.core.protocol.node import Done
from apps.orchestrator.streams import ChunkEv, DoneEv, LostEv, LostReason, RequestStream


async def test_events_in_order_then_terminal_and_nothing_after() -> None:
    stream = RequestStream("r", "n", limit=4)
    stream.deliver(ChunkEv("a"))
    stream.deliver(DoneEv(Done(request_id="r", prompt_tokens=1, completion_tokens=1)))
    stream.deliver(ChunkEv("late"))
    assert await stream.next(1) == ChunkEv("a")
    assert isinstance(await stream.next(1), DoneEv)
    assert await stream.next(0.01) is None


async def test_overflow_becomes_a_lost_event_instead_of_blocking() -> None:
    stream = RequestStream("r", "n", limit=2)
    for text in ("a", "b", "c", "d"):
        stream.deliver(ChunkEv(text))
    got = [await stream.next(1) for _ in range(3)]
    assert got == [ChunkEv("a"), ChunkEv("b"), LostEv(LostReason.RELAY_OVERFLOW)]
    assert stream.finished


async def test_deliver_says_when_it_woke_the_parked_relay() -> None:
    """The node socket's reader yields once after waking a relay (its first chunk then goes out
    before the rest of the reader's batch); it must not yield for queued or written-through chunks."""
    stream = RequestStream("r", "n", limit=8)
    assert stream.deliver(ChunkEv("queued")) is False  # nobody parked yet
    assert await stream.next(1) == ChunkEv("queued")
    parked = asyncio.ensure_future(stream.next(5))
    await asyncio.sleep(0)  # let the relay park on its waiter
    assert stream.deliver(ChunkEv("first")) is True
    assert await parked == ChunkEv("first")
    written: list[str] = []
    stream.sink = lambda delta: written.append(delta) is None
    parked = asyncio.ensure_future(stream.next(5))
    await asyncio.sleep(0)
    assert stream.deliver(ChunkEv("through")) is False  # written by the reader itself
    assert written == ["through"]
    assert stream.deliver(DoneEv(Done(request_id="r", prompt_tokens=1, completion_tokens=2))) is True
    assert isinstance(await parked, DoneEv)
    assert stream.deliver(ChunkEv("late")) is False  # finished
