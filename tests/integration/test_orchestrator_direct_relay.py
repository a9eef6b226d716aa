"""The orchestrator's direct relay path (`GatewayOutlet.through`, `RequestStream.sink`): chunks written to the
gateway's socket from the node socket's reader. Checked against an in-process orchestrator and a scripted
node: a long stream arrives complete and in order, and a gateway that stops reading pushes chunks back onto
the queued path (the sink declines while writing is paused) without losing or reordering any."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from apps.core.protocol.dispatch import DISPATCH_PATH
from apps.orchestrator import outlet
from tests.fakes.fake_node import Auto, FakeNode, vllm_chunk
from tests.integration.orchestrator_env import TOKEN, Env


def contents(body: bytes) -> list[str]:
    out = []
    for event in body.split(b"\n\n"):
        if event.startswith(b"data: {"):
            choices = json.loads(event[6:])["choices"]
            if choices:
                out.append(choices[0]["delta"].get("content", ""))
    return out


async def test_a_long_stream_arrives_complete_and_in_order(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    direct = 0
    original = outlet.GatewayOutlet.through

    def counting(self: Any, delta: str) -> bool:
        nonlocal direct
        wrote = original(self, delta)
        direct += wrote
        return wrote

    monkeypatch.setattr(outlet.GatewayOutlet, "through", counting)
    orch = await env.orchestrator()
    await env.node(orch, "n1", auto=Auto(tokens=500))
    await env.ledger.add("r1")
    status, _, body = await env.dispatch(orch, "r1")
    assert status == 200
    assert contents(body) == [f"t{i}" for i in range(500)]
    assert body.endswith(b"data: [DONE]\n\n")
    assert body.count(b"[DONE]") == 1
    assert direct > 0  # the direct path was taken (the node sends as fast as it can: some queue up)


async def _serve_big(node: FakeNode, n: int, size: int) -> None:
    assign = await asyncio.wait_for(node.assigns.get(), 10)
    rid = assign.request_id
    for i in range(n):
        await node.chunk(rid, vllm_chunk(rid, assign.model, f"{i}:" + "x" * size))
    await node.done(rid, 5, n, finish_reason="stop")


async def test_a_gateway_that_stops_reading_gets_every_chunk_in_order(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    paused = asyncio.Event()
    original = outlet.GatewayOutlet.through

    def spy(self: Any, delta: str) -> bool:
        wrote = original(self, delta)
        if not wrote and self.request.protocol.writing_paused:
            paused.set()
        return wrote

    monkeypatch.setattr(outlet.GatewayOutlet, "through", spy)
    orch = await env.orchestrator()
    node = await env.node(orch, "n1")
    await env.ledger.add("r1")
    n, size = 1500, 16 * 1024  # ~25 MB: more than the loopback socket buffers hold (up to ~10 MB)
    serving = asyncio.ensure_future(_serve_big(node, n, size))
    host, port = orch.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    payload = json.dumps(
        {
            "request_id": "r1",
            "team_id": 1,
            "key_id": 1,
            "model": "m",
            "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        }
    ).encode()
    writer.write(
        f"POST {DISPATCH_PATH} HTTP/1.1\r\nHost: o\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    await asyncio.wait_for(paused.wait(), 30)  # not reading: the orchestrator's writes to us backed up
    body = bytearray()
    while True:
        size_line = await asyncio.wait_for(reader.readuntil(b"\r\n"), 30)
        length = int(size_line[:-2], 16)
        if length == 0:
            break
        body += await reader.readexactly(length)
        await reader.readexactly(2)
    writer.close()
    await serving
    got = contents(bytes(body))
    assert [c.split(":", 1)[0] for c in got] == [str(i) for i in range(n)]
    assert all(len(c) == len(f"{i}:") + size for i, c in enumerate(got))
    assert bytes(body).endswith(b"data: [DONE]\n\n")


async def test_an_empty_chunk_from_a_node_does_not_end_the_response(env: Env) -> None:
    orch = await env.orchestrator()
    node = await env.node(orch, "n1")
    await env.ledger.add("r1")

    async def serve() -> None:
        assign = await asyncio.wait_for(node.assigns.get(), 10)
        rid = assign.request_id
        await node.chunk(rid, vllm_chunk(rid, "m", "a"))
        for text in ("", "b"):  # the relay is parked by now: these take the direct path
            await asyncio.sleep(0.05)
            await node.chunk(rid, text if not text else vllm_chunk(rid, "m", text))
        await node.done(rid, 5, 2, finish_reason="stop")

    serving = asyncio.ensure_future(serve())
    status, _, body = await env.dispatch(orch, "r1")
    await serving
    assert status == 200
    assert contents(body) == ["a", "b"]
    assert body.endswith(b"data: [DONE]\n\n")
