"""A node socket's reader does not hold the event loop for a whole engine step's batch of frames."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import WSMsgType

from apps.core.protocol import node as proto
from apps.orchestrator.node_ws import _YIELD_EVERY, NodeSockets
from apps.orchestrator.streams import RequestStream

pytestmark = pytest.mark.timeout(10)


class BufferedWs:
    """Frames already received: handed over without suspending, as aiohttp does from its buffer."""

    def __init__(self, texts: list[str]) -> None:
        self._texts = texts

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._gen()

    async def _gen(self) -> AsyncIterator[Any]:
        for text in self._texts:
            yield SimpleNamespace(type=WSMsgType.TEXT, data=text)


async def test_other_work_runs_while_a_large_batch_is_read() -> None:
    order: list[str] = []
    stream = RequestStream("r", "n", limit=1000)
    stream.sink = lambda delta: order.append(delta) is None
    parked = asyncio.ensure_future(stream.next(5))
    await asyncio.sleep(0)  # the relay parks: chunks are written through by the reader
    conn = SimpleNamespace(routes={"r": stream}, close=lambda *a: None, closing=asyncio.Event())
    frames = [proto.encode_chunk("r", f"c{i}") for i in range(4 * _YIELD_EVERY)]
    sockets = NodeSockets.__new__(NodeSockets)  # the reader needs only the plane for other routes
    sockets.plane = SimpleNamespace()

    async def other_work() -> None:
        order.append("other")

    other = asyncio.ensure_future(other_work())  # e.g. a new dispatch, ready to run
    await sockets._reader(BufferedWs(frames), conn)  # type: ignore[arg-type]
    await other
    assert order.count("other") == 1
    assert order.index("other") <= _YIELD_EVERY  # not after the whole batch
    assert [x for x in order if x != "other"] == [f"c{i}" for i in range(4 * _YIELD_EVERY)]
    parked.cancel()
