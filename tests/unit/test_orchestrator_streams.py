"""RequestStream: bounded, never blocks the delivering reader, terminal event always fits."""

from __future__ import annotations

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
