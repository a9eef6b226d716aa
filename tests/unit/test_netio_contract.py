"""Contract tests of the netio fast paths against the installed (pinned) uvicorn and aiohttp.

Each fast path relies on attributes outside the framework's public API. These tests run the
real servers and clients on loopback and check that the probe accepts the installed version, that
the fast path's bytes arrive exactly as the framework's own writer would have put them, that the
switch (`LLMFLEET_NETIO_FASTPATHS`) turns each one off, and that a fast path that breaks declines
instead of raising into the socket callback that called it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import uvicorn
from aiohttp import web
from prometheus_client import CollectorRegistry
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from apps.cli.procs import free_port as _free_port
from apps.core.envnames import env_name
from apps.gateway.settings import GatewaySettings
from apps.netio import fastpath
from apps.netio.aiohttp_server import ChunkWriter, chunk_writer
from apps.netio.uvicorn_writer import GatewayApp, direct_writer
from apps.orchestrator.settings import OrchestratorSettings


def test_the_switch_reads_on_off_and_a_list_of_paths() -> None:
    assert all(fastpath.enabled(p, "on") for p in fastpath.PATHS)
    assert not any(fastpath.enabled(p, " Off") for p in fastpath.PATHS)
    assert [p for p in fastpath.PATHS if fastpath.enabled(p, "aiohttp_chunk, ")] == ["aiohttp_chunk"]


@pytest.mark.parametrize("settings", [GatewaySettings, OrchestratorSettings])
def test_the_switch_is_each_apps_setting_read_at_start_up(
    settings: type[GatewaySettings] | type[OrchestratorSettings], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert env_name(settings, "netio_fastpaths") == "LLMFLEET_NETIO_FASTPATHS"
    monkeypatch.delenv("LLMFLEET_NETIO_FASTPATHS", raising=False)
    assert settings().netio_fastpaths == "on"
    monkeypatch.setenv("LLMFLEET_NETIO_FASTPATHS", "uvicorn_chunk")
    assert settings().netio_fastpaths == "uvicorn_chunk"


def test_the_metric_counts_fast_and_fallback_pieces_per_path() -> None:
    registry = CollectorRegistry()
    metrics = fastpath.PathMetrics(registry)
    metrics.served(fastpath.AIOHTTP_CHUNK, fast=3, fallback=1)
    labels = {"path": "aiohttp_chunk", "mode": "fast"}
    assert registry.get_sample_value("llmfleet_netio_path_total", labels) == 3
    assert registry.get_sample_value("llmfleet_netio_path_total", {**labels, "mode": "fallback"}) == 1


# -- uvicorn (httptools) ------------------------------------------------------------------------


async def _serve_uvicorn(app: Any) -> tuple[uvicorn.Server, asyncio.Task[None], int]:
    port = _free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, http="httptools", log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve())
    async with asyncio.timeout(10):  # poll with a deadline: uvicorn has no "started" event
        while not server.started:
            await asyncio.sleep(0.01)
    return server, task, port


@pytest.mark.parametrize("switch", ["on", "off"])
async def test_uvicorn_direct_writer_frames_chunks_as_uvicorn_does(
    switch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(env_name(GatewaySettings, "netio_fastpaths"), switch)
    fast_paths = GatewaySettings().netio_fastpaths  # as the gateway reads it at start-up
    probed: list[bool] = []

    class Body:
        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
            )
            writer = direct_writer(scope, switch=fast_paths)
            probed.append(writer is not None)
            for piece in (b"one ", b"two ", b"three"):
                if writer is None or not writer.write(piece):
                    await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def endpoint(_: Request) -> Any:
        return Body()

    server, task, port = await _serve_uvicorn(GatewayApp(routes=[Route("/", endpoint)]))
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/") as resp:
            assert resp.headers.get("Transfer-Encoding") == "chunked"
            assert await resp.read() == b"one two three"
    finally:
        server.should_exit = True
        await task
    assert probed == [switch == "on"]


async def test_uvicorn_direct_writer_is_not_offered_for_a_plain_starlette_send() -> None:
    async def gen() -> AsyncIterator[bytes]:
        yield b"x"

    seen: list[object] = []

    async def endpoint(request: Request) -> StreamingResponse:
        seen.append(direct_writer(request.scope, switch="on"))
        return StreamingResponse(gen())

    from starlette.applications import Starlette

    server, task, port = await _serve_uvicorn(Starlette(routes=[Route("/", endpoint)]))
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/") as resp:
            assert await resp.read() == b"x"
    finally:
        server.should_exit = True
        await task
    assert seen == [None]  # no raw send recorded: no fast path


# -- aiohttp server ---------------------------------------------------------------------------------


async def _serve_aiohttp(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


@pytest.mark.parametrize("switch", ["on", "off"])
async def test_aiohttp_chunk_writer_frames_chunks_as_aiohttp_does(
    switch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(env_name(OrchestratorSettings, "netio_fastpaths"), switch)
    fast_paths = OrchestratorSettings().netio_fastpaths  # as the orchestrator reads it at start-up
    probed: list[bool] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        assert chunk_writer(request, response, switch=fast_paths) is None  # not prepared yet
        await response.prepare(request)
        await response.write(b"head ")  # puts the buffered headers out
        writer = chunk_writer(request, response, switch=fast_paths)
        probed.append(writer is not None)
        for piece in (b"one ", b"", b"two"):
            if writer is None or not writer.write(piece):
                await response.write(piece)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/", handler)
    runner, port = await _serve_aiohttp(app)
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/") as resp:
            assert await resp.read() == b"head one two"
    finally:
        await runner.cleanup()
    assert probed == [switch == "on"]


def test_aiohttp_chunk_writer_that_breaks_declines_instead_of_raising() -> None:
    class Transport:
        def is_closing(self) -> bool:
            return False

        def write(self, data: bytes) -> None:
            raise RuntimeError("transport changed shape")

    class Protocol:
        writing_paused = False

    class Req:
        transport = Transport()

    writer = ChunkWriter(Req(), Protocol())  # type: ignore[arg-type]
    assert writer.write(b"x") is False
    assert writer.broken
    assert writer.write(b"y") is False
    assert writer.written == 0
