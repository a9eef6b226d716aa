"""`create_app(settings, deps)`: the gateway's only wiring point (Starlette)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from apps.core.errors import LlmfleetError, NotFound, Unavailable
from apps.gateway.admin_routes import admin_routes
from apps.gateway.auth import authenticate
from apps.gateway.chat import ChatHandler
from apps.gateway.console import console_mount
from apps.gateway.deps import GatewayDeps
from apps.gateway.errors import error_response
from apps.gateway.metrics import GatewayMetrics
from apps.gateway.settings import GatewaySettings
from apps.gateway.usage import usage_route
from apps.netio.uvicorn_writer import GatewayApp


def create_app(settings: GatewaySettings, deps: GatewayDeps) -> GatewayApp:
    metrics = GatewayMetrics(deps.registry)
    chat = ChatHandler(settings, deps, metrics)

    async def models(request: Request) -> JSONResponse:
        principal = await authenticate(request, deps, settings)
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "llmfleet"}
            for name in deps.spec.models
            if principal.may_use(name)
        ]
        return JSONResponse({"object": "list", "data": data})

    async def livez(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(request: Request) -> Response:
        if deps.lifecycle.stopping:
            return JSONResponse({"stopping": True}, status_code=503)
        pg, rd = await asyncio.gather(deps.health.postgres_ok(), deps.health.redis_ok())
        body = {"postgres": pg, "redis": rd}
        return JSONResponse(body, status_code=200 if pg and rd else 503)

    async def chat_completions(request: Request) -> Response:
        if deps.lifecycle.stopping:
            # A request on a kept-alive connection after SIGTERM: nothing reserved, retry elsewhere.
            raise Unavailable("The gateway is shutting down.", code="shutting_down", retry_after=1)
        return await chat.handle(request)

    async def metrics_view(request: Request) -> Response:
        server = request.scope.get("server")
        if settings.metrics_port is not None and (server is None or server[1] != settings.metrics_port):
            raise NotFound("Metrics are served on the metrics port.")
        return Response(generate_latest(deps.registry), media_type=CONTENT_TYPE_LATEST)

    async def on_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, LlmfleetError)
        return error_response(exc)

    @asynccontextmanager
    async def lifespan(app: GatewayApp) -> AsyncIterator[None]:
        try:
            yield
        finally:
            for close in deps.closers:
                await close()

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/usage", usage_route(settings, deps), methods=["GET"]),
        Route("/livez", livez, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics_view, methods=["GET"]),
        *admin_routes(settings, deps),
        console_mount(settings, deps),
    ]
    return GatewayApp(routes=routes, exception_handlers={LlmfleetError: on_error}, lifespan=lifespan)
