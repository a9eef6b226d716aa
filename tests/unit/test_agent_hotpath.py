"""The agent's hot path: frames queued together leave in one corked batch, in order, and
the chunk encoder on the way out is the protocol's one codec."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any, cast

import aiohttp
import aiohttp.web
import pytest

from apps.agent.connection import Connection
from apps.core.protocol import node as proto
from tests.fakes.fake_orchestrator import running_agent

GUARD_S = 10.0


class RecordingSocket:
    def __init__(self) -> None:
        self.options: list[tuple[int, int, int]] = []

    def setsockopt(self, level: int, option: int, value: int) -> None:
        self.options.append((level, option, value))


class FakeWs:
    """What `Connection` uses of `aiohttp.ClientWebSocketResponse`."""

    def __init__(self, sock: RecordingSocket | None) -> None:
        self.sock = sock
        self.close_code: int | None = None
        self.log: list[Any] = []  # sent texts and cork changes, in order
        self.sent = asyncio.Event()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.sock if name == "socket" else default

    async def send_str(self, text: str) -> None:
        self.log.append(text)
        self.sent.set()


def _conn(ws: FakeWs) -> Connection:
    return Connection(cast(aiohttp.ClientWebSocketResponse, ws), queue_size=64)


async def _drain(conn: Connection, ws: FakeWs, frames: int) -> None:
    writer = asyncio.ensure_future(conn.writer())
    try:
        async with asyncio.timeout(GUARD_S):
            while sum(1 for x in ws.log if isinstance(x, str)) < frames:
                ws.sent.clear()
                await ws.sent.wait()
            await conn.flush(GUARD_S)
    finally:
        writer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await writer


async def test_frames_queued_together_go_out_corked_and_in_order() -> None:
    sock = RecordingSocket()
    ws = FakeWs(sock)
    conn = _conn(ws)
    for i in range(5):
        assert await conn.send(proto.Chunk(request_id=f"r{i}", delta=f"data: {i}\n\n"))
    await _drain(conn, ws, 5)
    assert ws.log == [proto.encode_chunk(f"r{i}", f"data: {i}\n\n") for i in range(5)]
    cork = socket.TCP_CORK  # Linux, like production and CI
    assert sock.options == [(socket.IPPROTO_TCP, cork, 1), (socket.IPPROTO_TCP, cork, 0)]


async def test_a_first_chunk_leads_its_batch_without_reordering_the_rest() -> None:
    ws = FakeWs(RecordingSocket())
    conn = _conn(ws)
    for i in range(4):
        assert await conn.send(proto.Chunk(request_id=f"r{i}", delta=f"data: {i}\n\n"))
    assert await conn.send(proto.Chunk(request_id="new", delta="data: first\n\n"), urgent=True)
    assert await conn.send(proto.Chunk(request_id="new", delta="data: second\n\n"))
    assert await conn.send(proto.Chunk(request_id="new2", delta="data: first\n\n"), urgent=True)
    await _drain(conn, ws, 7)
    sent = [x for x in ws.log if isinstance(x, str)]
    assert sent == [
        proto.encode_chunk("new", "data: first\n\n"),
        proto.encode_chunk("new2", "data: first\n\n"),
        *(proto.encode_chunk(f"r{i}", f"data: {i}\n\n") for i in range(4)),
        proto.encode_chunk("new", "data: second\n\n"),  # after its own first chunk, always
    ]


async def test_a_single_frame_is_not_corked_and_no_socket_is_fine() -> None:
    sock = RecordingSocket()
    ws = FakeWs(sock)
    conn = _conn(ws)
    assert await conn.send(proto.Chunk(request_id="r", delta="data: x\n\n"))
    await _drain(conn, ws, 1)
    assert sock.options == []  # one frame: nothing to merge, no extra syscalls

    bare = FakeWs(None)  # e.g. a transport without a socket: frames still go out
    conn2 = _conn(bare)
    for i in range(3):
        assert await conn2.send(proto.Chunk(request_id="r", delta=str(i)))
    await _drain(conn2, bare, 3)
    assert bare.log == [proto.encode_chunk("r", str(i)) for i in range(3)]


async def test_version_2_sends_a_batch_as_one_message_urgent_first_and_uncorked() -> None:
    sock = RecordingSocket()
    ws = FakeWs(sock)
    conn = Connection(cast(aiohttp.ClientWebSocketResponse, ws), queue_size=64, batching=True)
    for i in range(3):
        assert await conn.send(proto.Chunk(request_id=f"r{i}", delta=f"data: {i}\n\n"))
    assert await conn.send(proto.Chunk(request_id="new", delta="data: first\n\n"), urgent=True)
    assert await conn.send(proto.Done(request_id="r0", prompt_tokens=1, completion_tokens=1))
    await _drain(conn, ws, 1)
    assert len(ws.log) == 1  # one message for the whole batch
    frames = [proto.decode_node_frame(text) for text in proto.split_frames(ws.log[0])]
    assert [(f.type, f.request_id) for f in frames] == [  # type: ignore[union-attr]
        ("chunk", "new"),
        ("chunk", "r0"),
        ("chunk", "r1"),
        ("chunk", "r2"),
        ("done", "r0"),
    ]
    assert frames[1] == proto.Chunk(request_id="r0", delta="data: 0\n\n")  # newlines survive the join
    assert sock.options == []  # one write: no cork needed


async def test_version_2_splits_a_batch_larger_than_the_message_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import apps.agent.connection as connection

    monkeypatch.setattr(connection, "_MESSAGE_MAX", 200)  # two of these frames per message
    ws = FakeWs(RecordingSocket())
    conn = Connection(cast(aiohttp.ClientWebSocketResponse, ws), queue_size=64, batching=True)
    deltas = [f"data: {'x' * 30}{i}\n\n" for i in range(6)]
    for i, delta in enumerate(deltas):
        assert await conn.send(proto.Chunk(request_id=f"r{i}", delta=delta))
    await _drain(conn, ws, 2)
    sent = [x for x in ws.log if isinstance(x, str)]
    assert [len(proto.split_frames(m)) for m in sent] == [2, 2, 2]
    assert all(len(m) <= 200 for m in sent)
    frames = [proto.decode_node_frame(t) for m in sent for t in proto.split_frames(m)]
    assert frames == [proto.Chunk(request_id=f"r{i}", delta=d) for i, d in enumerate(deltas)]


async def test_the_agent_runs_every_frame_of_a_batched_message_from_the_orchestrator(tmp_path: Path) -> None:
    async with running_agent(tmp_path) as run:
        await run.orch.send_batch([run.assign("b1", 2), run.assign("b2", 3)])
        first, second = await run.result("b1"), await run.result("b2")
        assert isinstance(first, proto.Done)
        assert isinstance(second, proto.Done)
        assert (first.completion_tokens, second.completion_tokens) == (2, 3)


class _WsServer:
    """A real aiohttp WebSocket server that records each message it receives."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.received = asyncio.Event()

    async def handler(self, request: aiohttp.web.Request) -> aiohttp.web.WebSocketResponse:
        ws = aiohttp.web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            self.messages.append(msg.data)
            self.received.set()
        return ws

    async def wait_for(self, count: int) -> None:
        async with asyncio.timeout(GUARD_S):
            while len(self.messages) < count:
                self.received.clear()
                await self.received.wait()


@pytest.fixture
async def ws_server() -> Any:
    server = _WsServer()
    app = aiohttp.web.Application()
    app.router.add_get("/ws", server.handler)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield server, f"http://127.0.0.1:{port}/ws"
    finally:
        await runner.cleanup()


async def test_an_urgent_first_chunk_leads_the_batch_it_is_sent_in(ws_server: Any) -> None:
    server, url = ws_server
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        conn = Connection(ws, queue_size=64, batching=True)
        assert await conn.send(proto.Chunk(request_id="r0", delta="data: 0\n\n"))
        assert await conn.send(proto.Chunk(request_id="new", delta="data: first\n\n"), urgent=True)
        writer = asyncio.ensure_future(conn.writer())
        try:
            await server.wait_for(1)
        finally:
            writer.cancel()
            with pytest.raises(asyncio.CancelledError):
                await writer
    frames = [proto.decode_node_frame(t) for t in proto.split_frames(server.messages[0])]
    assert [f.request_id for f in frames] == ["new", "r0"]  # type: ignore[union-attr]
