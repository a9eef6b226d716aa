"""`HttpDispatcher` and `build_deps` against real servers: an in-process aiohttp orchestrator
stand-in on loopback, and the machine's PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from apps.cli.procs import free_port as closed_port
from apps.core.protocol.dispatch import DISPATCH_PATH, DispatchRequest
from apps.gateway.dispatcher import HttpDispatcher
from apps.gateway.ports import DispatchUnavailable
from apps.gateway.settings import GatewaySettings
from apps.gateway.wiring import build_deps
from tests.fakes.web_server import serve_app

PARTS = [b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n', b"data: [DONE]\n\n"]


def request() -> DispatchRequest:
    return DispatchRequest(request_id="r-12345678", team_id=1, model="m", body={"messages": []})


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
    async with serve_app(app) as url:
        yield url, seen, cut


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


@dataclass
class Scripted:
    url: str
    # Per request, in order: "busy" (503 JSON), "short" (whole body), "hang" (mid-body), "slow" (no head).
    modes: list[str]
    transports: list[int] = field(default_factory=list)  # the server-side connection of each request
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    gone: asyncio.Event = field(default_factory=asyncio.Event)  # a hanging request saw the disconnect


@pytest.fixture
async def scripted() -> AsyncIterator[Scripted]:
    """An orchestrator stand-in scripted per request; a hanging stream waits until the gateway
    disconnects (aiohttp then cancels the handler, as in the real orchestrator)."""
    script = Scripted("", [])

    async def dispatch(req: web.Request) -> web.StreamResponse:
        script.transports.append(id(req.transport))
        await req.read()
        script.arrived.set()
        mode = script.modes.pop(0)
        if mode == "busy":
            return web.json_response(
                {"error": {"message": "no node"}}, status=503, headers={"Retry-After": "2"}
            )
        if mode == "short":
            return web.Response(body=b"".join(PARTS), content_type="text/event-stream")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        try:
            if mode == "hang":
                await resp.prepare(req)
                await resp.write(PARTS[0])
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            script.gone.set()
            raise
        return resp

    app = web.Application()
    app.router.add_post(DISPATCH_PATH, dispatch)
    async with serve_app(app, handler_cancellation=True) as url:
        script.url = url
        yield script


async def test_error_answer_and_streams_reuse_one_keep_alive_connection(scripted: Scripted) -> None:
    scripted.modes = ["busy", "short", "short"]
    dispatcher = HttpDispatcher([scripted.url], "internal")
    try:
        busy = await dispatcher.open(request())
        assert (busy.status, busy.headers["retry-after"]) == (503, "2")
        assert json.loads(await busy.read_body())["error"]["message"] == "no node"
        await busy.aclose()
        for _ in range(2):
            upstream = await dispatcher.open(request())
            assert b"".join([d async for d in upstream.chunks()]) == b"".join(PARTS)
            await upstream.aclose()
    finally:
        await dispatcher.aclose()
    assert len(scripted.transports) == 3
    assert len(set(scripted.transports)) == 1


async def test_early_close_reaches_the_orchestrator_and_is_not_reused(scripted: Scripted) -> None:
    scripted.modes = ["hang", "short"]
    dispatcher = HttpDispatcher([scripted.url], "internal")
    try:
        upstream = await dispatcher.open(request())
        assert await anext(upstream.chunks()) == PARTS[0]
        await upstream.aclose()
        async with asyncio.timeout(10):
            await scripted.gone.wait()  # the orchestrator's handler was cancelled: it cancels on the node
        again = await dispatcher.open(request())
        assert await again.read_body() == b"".join(PARTS)
        await again.aclose()
    finally:
        await dispatcher.aclose()
    assert len(scripted.transports) == 2


async def test_cancelled_open_drops_the_connection(scripted: Scripted) -> None:
    """chat.py bounds `open()` with a timeout; a cancelled open must not leave the request running."""
    scripted.modes = ["slow"]
    dispatcher = HttpDispatcher([scripted.url], "internal")
    try:
        task = asyncio.ensure_future(dispatcher.open(request()))
        async with asyncio.timeout(10):
            await scripted.arrived.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with asyncio.timeout(10):
            await scripted.gone.wait()
    finally:
        await dispatcher.aclose()


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


async def test_a_stopping_replica_refusal_sends_the_dispatch_to_the_next_replica(
    orchestrator: tuple[str, list[dict[str, object]], asyncio.Event],
) -> None:
    """A 503 with `x-llmfleet-retry-elsewhere` (nothing ran there: apps/orchestrator/handover.py)
    is not the answer: the next replica gets the request. A 503 without it is an answer."""
    from apps.core.protocol.dispatch import RETRY_ELSEWHERE
    from apps.gateway.dispatcher import MAX_REFUSALS

    url, seen, _ = orchestrator
    refused: list[str] = []

    async def stopping(req: web.Request) -> web.Response:
        refused.append((await req.json())["request_id"])
        return web.json_response(
            {"error": {"code": "orchestrator_stopping"}}, status=503, headers={RETRY_ELSEWHERE: "1"}
        )

    async def plain_503(req: web.Request) -> web.Response:
        return web.json_response({"error": {"code": "queue_full"}}, status=503)

    stopping_app, busy_app = web.Application(), web.Application()
    stopping_app.router.add_post(DISPATCH_PATH, stopping)
    busy_app.router.add_post(DISPATCH_PATH, plain_503)
    async with serve_app(stopping_app) as first, serve_app(busy_app) as busy:
        dispatcher = HttpDispatcher([first, url], "internal")
        try:
            for _ in range(2):  # whichever replica the rotation starts with
                upstream = await dispatcher.open(request())
                assert upstream.status == 200
                assert b"".join([d async for d in upstream.chunks()]) == b"".join(PARTS)
            assert len(seen) == 2
            assert refused == ["r-12345678"]  # tried once, when the rotation started there
        finally:
            await dispatcher.aclose()
        only_stopping = HttpDispatcher([first], "internal")
        try:
            with pytest.raises(DispatchUnavailable):
                await only_stopping.open(request())
        finally:
            await only_stopping.aclose()
        # One URL (a Service): tried again on fresh connections, a bounded number of times.
        assert len(refused) == 1 + 1 + MAX_REFUSALS
        answered = HttpDispatcher([busy, url], "internal")
        try:
            upstream = await answered.open(request())
            assert upstream.status == 503  # an answer: never sent elsewhere (it may have run)
            await upstream.aclose()
        finally:
            await answered.aclose()
