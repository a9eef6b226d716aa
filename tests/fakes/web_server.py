"""Serve an aiohttp `web.Application` on a free loopback port for the length of a block."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web


@contextlib.asynccontextmanager
async def serve_app(app: web.Application, *, handler_cancellation: bool = False) -> AsyncIterator[str]:
    """Yields the base URL (`http://127.0.0.1:PORT`); the server is cleaned up on exit."""
    runner = web.AppRunner(app, access_log=None, handler_cancellation=handler_cancellation)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
