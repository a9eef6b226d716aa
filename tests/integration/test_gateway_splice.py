"""The relay's direct path (`apps/netio/uvicorn_writer.py`): the real gateway served by uvicorn (httptools),
the real `HttpDispatcher`, a scripted HTTP upstream streaming numbered, padded SSE events at a pace and
size no engine produces (a transport test: the bytes, not their meaning, matter). Checked: the
direct path is taken and the client gets exactly the upstream's bytes; a client that stops reading
pushes chunks onto the ASGI path (flow control) without losing or reordering any; a client that
leaves mid-stream closes the upstream connection and nothing fails inside a callback."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from apps.core.protocol.dispatch import DISPATCH_PATH
from apps.netio import uvicorn_writer as splice
from tests.fakes.web_server import serve_app
from tests.fleet import FleetSetup
from tests.gateway_env import GatewayEnv, gateway_env

MODEL = "llama-3.1-8b-instruct"
NO_NODE = FleetSetup(nodes=0)  # the gateway dispatches to the scripted upstream, not to the fleet


@dataclass
class Upstream:
    url: str = ""
    events: int = 40
    pad: int = 0  # bytes of padding per event
    interval_s: float = 0.002  # the pace of a decoding engine
    sent: list[bytes] = field(default_factory=list)
    closed_early: asyncio.Event = field(default_factory=asyncio.Event)

    def event(self, i: int) -> bytes:
        payload = {"choices": [{"index": 0, "delta": {"content": f"t{i} "}}], "i": i, "pad": "x" * self.pad}
        return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    state = Upstream()

    async def dispatch(req: web.Request) -> web.StreamResponse:
        await req.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        try:
            for i in range(state.events):
                data = state.event(i)
                await resp.write(data)
                state.sent.append(data)
                await asyncio.sleep(state.interval_s)
            await resp.write(b"data: [DONE]\n\n")
            state.sent.append(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            state.closed_early.set()
            raise
        return resp

    app = web.Application()
    app.router.add_post(DISPATCH_PATH, dispatch)
    async with serve_app(app, handler_cancellation=True) as url:
        state.url = url
        yield state


async def _open(env: GatewayEnv, key: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = env.base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    ).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %b\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (key.encode(), len(body), body)
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"transfer-encoding: chunked" in head.lower()
    return reader, writer


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return bytes(out)
        out += await reader.readexactly(size)
        assert await reader.readexactly(2) == b"\r\n"


def _paths(env: GatewayEnv) -> dict[str, float]:
    counts: dict[str, float] = {}
    for metric in env.deps.registry.collect():
        if metric.name == "llmfleet_gateway_relayed_chunks":
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    counts[sample.labels["path"]] = sample.value
    return counts


async def test_chunks_go_out_directly_and_byte_for_byte(
    migrated_db_url: str, redis_url: str, upstream: Upstream
) -> None:
    async with gateway_env(
        migrated_db_url, redis_url, serve=True, fleet=NO_NODE, upstream_url=upstream.url
    ) as env:
        _, key = await env.team_with_key("a")
        reader, writer = await _open(env, key)
        body = await _read_chunked(reader)
        writer.close()
        assert body == b"".join(upstream.sent)
        assert [json.loads(line[6:])["i"] for line in body.split(b"\n\n")[:-2]] == list(
            range(upstream.events)
        )

        async def counted() -> dict[str, float]:
            deadline = time.monotonic() + 10
            while sum(_paths(env).values()) < 2:  # recorded by the relay's cleanup
                assert time.monotonic() < deadline, _paths(env)
                await asyncio.sleep(0.01)
            return _paths(env)

        paths = await counted()
        # Paced events bypass ASGI; so does the first read, which arrives with the headers (written
        # by the task the head woke: `RelayResponse._write_buffered`).
        assert paths.get("direct", 0) >= upstream.events // 2, paths


async def test_a_client_that_stops_reading_gets_everything_in_order_through_send(
    migrated_db_url: str, redis_url: str, upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream.events, upstream.pad, upstream.interval_s = 400, 64 * 1024, 0.0  # ~26 MB, as fast as it goes
    paused = asyncio.Event()
    original = splice.DirectWriter.write

    def spy(self: splice.DirectWriter, data: bytes) -> bool:
        wrote = original(self, data)
        if not wrote and self._flow.write_paused:
            paused.set()
        return wrote

    monkeypatch.setattr(splice.DirectWriter, "write", spy)
    async with gateway_env(
        migrated_db_url, redis_url, serve=True, fleet=NO_NODE, upstream_url=upstream.url
    ) as env:
        _, key = await env.team_with_key("a")
        reader, writer = await _open(env, key)
        await asyncio.wait_for(paused.wait(), 30)  # the gateway's socket to us is full: not reading
        body = await _read_chunked(reader)
        writer.close()
    assert body == b"".join(upstream.sent)
    numbers = [json.loads(line[6:])["i"] for line in body.split(b"\n\n")[:-2]]
    assert numbers == list(range(upstream.events))


async def test_a_client_leaving_mid_stream_closes_upstream_with_no_callback_errors(
    migrated_db_url: str, redis_url: str, upstream: Upstream
) -> None:
    upstream.events, upstream.interval_s = 100_000, 0.001
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        async with gateway_env(
            migrated_db_url, redis_url, serve=True, fleet=NO_NODE, upstream_url=upstream.url
        ) as env:
            _, key = await env.team_with_key("a")
            reader, writer = await _open(env, key)
            for _ in range(20):  # well into the stream: the direct path is in use
                await reader.readuntil(b"\n\n")
            writer.close()
            await asyncio.wait_for(upstream.closed_early.wait(), 10)

            async def slot_released() -> bool:
                return bool(await env.redis.scard("streams:1") == 0)

            deadline = time.monotonic() + 10
            while not await slot_released():
                assert time.monotonic() < deadline, "stream slot still held"
                await asyncio.sleep(0.01)
    finally:
        loop.set_exception_handler(previous)
    assert errors == []
    assert len(upstream.sent) < upstream.events
