"""`HttpDispatcher` and `build_deps` against real servers: an in-process aiohttp orchestrator
stand-in on loopback, and the machine's PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from apps.core.protocol.dispatch import DISPATCH_PATH, DispatchRequest
from apps.gateway.dispatcher import HttpDispatcher
from apps.gateway.ports import DispatchUnavailable
from apps.gateway.settings import GatewaySettings
from apps.gateway.wiring import build_deps

PARTS = [b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n', b"data: [DONE]\n\n"]


def request() -> DispatchRequest:
    return DispatchRequest(request_id="r-12345678", team_id=1, model="m", body={"messages": []})


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def orchestrator() -> AsyncIterator[tuple[str, list[dict[str, object]], asyncio.Event]]:
    seen: list[dict[str, object]] = []
    cut = asyncio.Event()

    async def dispatch(req: web.Request) -> web.StreamResponse:
        seen.append({"auth": req.headers.get("Authorization"), "body": await req.json()})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        await resp.write(PARTS[0])
        if req.query.get("cut") or cut.is_set():
            assert req.transport is not None
            req.transport.close()  # the orchestrator dies mid-stream
            return resp
        await resp.write(PARTS[1])
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post(DISPATCH_PATH, dispatch)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", seen, cut
    finally:
        await runner.cleanup()


async def test_stream_relayed_in_order_with_token(
    orchestrator: tuple[str, list[dict[str, object]], asyncio.Event],
) -> None:
    url, seen, _ = orchestrator
    dispatcher = HttpDispatcher([url], "internal")
    try:
        upstream = await dispatcher.open(request())
        assert upstream.status == 200
        assert upstream.headers["content-type"] == "text/event-stream"
        body = b"".join([data async for data in upstream.chunks()])
        await upstream.aclose()
    finally:
        await dispatcher.aclose()
    assert body == b"".join(PARTS)
    assert seen[0]["auth"] == "Bearer internal"
    assert seen[0]["body"]["request_id"] == "r-12345678"  # type: ignore[index]


async def test_refused_replica_is_skipped_and_none_reachable_is_unavailable(
    orchestrator: tuple[str, list[dict[str, object]], asyncio.Event],
) -> None:
    url, seen, _ = orchestrator
    dead = f"http://127.0.0.1:{closed_port()}"
    dispatcher = HttpDispatcher([dead, url], "internal")
    try:
        for _ in range(2):  # whichever replica the rotation starts with, the live one answers
            upstream = await dispatcher.open(request())
            assert b"".join([d async for d in upstream.chunks()]) == b"".join(PARTS)
            await upstream.aclose()
    finally:
        await dispatcher.aclose()
    assert len(seen) == 2
    nobody = HttpDispatcher([dead], "internal")
    try:
        with pytest.raises(DispatchUnavailable):
            await nobody.open(request())
    finally:
        await nobody.aclose()


async def test_connection_lost_mid_stream_is_an_oserror(
    orchestrator: tuple[str, list[dict[str, object]], asyncio.Event],
) -> None:
    url, _, cut = orchestrator
    cut.set()
    dispatcher = HttpDispatcher([url], "internal")
    got: list[bytes] = []
    try:
        upstream = await dispatcher.open(request())
        chunks = upstream.chunks()
        got.append(await anext(chunks))
        with pytest.raises(OSError):
            await anext(chunks)
        await upstream.aclose()
    finally:
        await dispatcher.aclose()
    assert b"".join(got) == PARTS[0]


async def test_build_deps_reserves_and_cancels_on_the_autocommit_pool(
    migrated_db_url: str, redis_url: str
) -> None:
    settings = GatewaySettings(
        database_url=migrated_db_url, redis_url=redis_url, secret_key="s", stack="dev", pg_pool_min=1
    )
    deps = await build_deps(settings)
    try:
        team = await deps.teams.create_team("wired")
        await deps.teams.add_credits(team.id, 10**12)
        model = next(iter(deps.spec.models))
        await deps.ledger.reserve(
            request_id="wired-1",
            team_id=team.id,
            key_id=None,
            model=model,
            estimated_prompt_tokens=10,
            max_tokens=10,
        )
        assert await deps.ledger.open_reservations() == 1
        assert await deps.ledger.cancel("wired-1")
        assert await deps.ledger.open_reservations() == 0
        assert await deps.health.postgres_ok()
        assert await deps.health.redis_ok()
    finally:
        for close in deps.closers:
            await close()
