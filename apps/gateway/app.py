"""`create_app(settings, deps)`: the gateway's only wiring point (Starlette)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from apps.core.errors import (
    ForwardedError,
    InvalidRequest,
    LlmfleetError,
    NotFound,
    Unavailable,
    unknown_route,
)
from apps.core.metrics_access import metrics_refusal
from apps.gateway.admin_routes import AdminApi
from apps.gateway.auth import authenticate
from apps.gateway.cache_routes import CacheAdminApi
from apps.gateway.chat import ChatHandler
from apps.gateway.console import console_mount
from apps.gateway.deps import GatewayDeps
from apps.gateway.errors import error_response
from apps.gateway.guardrail_routes import GuardrailAdminApi
from apps.gateway.metrics import GatewayMetrics
from apps.gateway.settings import GatewaySettings
from apps.gateway.usage import usage_route
from apps.gateway.validate import Endpoint
from apps.netio.uvicorn_writer import GatewayApp

log = logging.getLogger("llmfleet.gateway")


def model_object(name: str) -> dict[str, object]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "llmfleet"}


class PublicApi:
    """The gateway's own routes (chat, completions, embeddings, models, health, metrics): each a method,
    `routes()` their table."""

    def __init__(self, settings: GatewaySettings, deps: GatewayDeps) -> None:
        self.settings = settings
        self.deps = deps
        self.chat = ChatHandler(settings, deps, GatewayMetrics(deps.registry))

    def routes(self) -> list[Route]:
        return [
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/embeddings", self.embeddings, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/models/{model:path}", self.model, methods=["GET"]),
            Route("/v1/usage", usage_route(self.settings, self.deps), methods=["GET"]),
            Route("/livez", self.livez, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
            Route("/metrics", self.metrics_view, methods=["GET"]),
        ]

    async def models(self, request: Request) -> JSONResponse:
        principal = await authenticate(request, self.deps, self.settings)
        data = [model_object(name) for name in self.deps.spec.models if principal.may_use(name)]
        return JSONResponse({"object": "list", "data": data})

    async def model(self, request: Request) -> JSONResponse:
        """`client.models.retrieve(name)`: a model the caller may use, else 404 (a model outside the
        allowlist is not revealed: the same answer as one that does not exist)."""
        principal = await authenticate(request, self.deps, self.settings)
        name = request.path_params["model"]
        if name not in self.deps.spec.models or not principal.may_use(name):
            raise NotFound(f"The model `{name[:200]}` does not exist.", param="model")
        return JSONResponse(model_object(name))

    async def livez(self, request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(self, request: Request) -> Response:
        if self.deps.lifecycle.stopping:
            return JSONResponse({"stopping": True}, status_code=503)
        pg, rd = await asyncio.gather(self.deps.health.postgres_ok(), self.deps.health.redis_ok())
        body = {"postgres": pg, "redis": rd}
        return JSONResponse(body, status_code=200 if pg and rd else 503)

    async def chat_completions(self, request: Request) -> Response:
        return await self._inference(request, "chat")

    async def completions(self, request: Request) -> Response:
        return await self._inference(request, "completions")

    async def embeddings(self, request: Request) -> Response:
        return await self._inference(request, "embeddings")

    async def _inference(self, request: Request, endpoint: Endpoint) -> Response:
        if self.deps.lifecycle.stopping:
            # A request on a kept-alive connection after SIGTERM: nothing reserved, retry elsewhere.
            raise Unavailable("The gateway is shutting down.", code="shutting_down", retry_after=1)
        return await self.chat.handle(request, endpoint)

    async def metrics_view(self, request: Request) -> Response:
        server = request.scope.get("server")
        port = self.settings.metrics_port
        if port is not None and (server is None or server[1] != port):
            raise NotFound("Metrics are served on the metrics port.")
        refusal = metrics_refusal(
            token=self.settings.metrics_token,
            authorization=request.headers.get("authorization"),
            client_host=request.client.host if request.client else None,
            on_metrics_port=port is not None,
        )
        if refusal is not None:
            raise refusal
        return Response(generate_latest(self.deps.registry), media_type=CONTENT_TYPE_LATEST)


async def on_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, LlmfleetError)
    return error_response(exc)


async def on_http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 (no route, wrong method) in the OpenAI envelope, `Allow` kept."""
    assert isinstance(exc, HTTPException)
    error: LlmfleetError
    if exc.status_code in (404, 405):
        error = unknown_route(request.method, request.url.path, exc.status_code)
    else:
        error = ForwardedError(str(exc.detail), status=exc.status_code, error_type="invalid_request_error")
    return error_response(error, exc.headers)


async def on_data_error(request: Request, exc: Exception) -> Response:
    """The last line of the input checks: a value PostgreSQL refuses to store or compare (a NUL in
    text, a number past its column) is the request's fault, so a 400 in the OpenAI envelope on a
    connection that stays open, never a 500 that drops it. The routes check their inputs first
    (`apps.gateway.inputs`); reaching this is a gap to close there, hence the warning."""
    log.warning(
        "database refused a request value on %s %s: %s", request.method, request.url.path, type(exc).__name__
    )
    return error_response(
        InvalidRequest("A value in the request cannot be stored (out of range or not text).", param=None)
    )


def create_app(settings: GatewaySettings, deps: GatewayDeps) -> GatewayApp:
    @asynccontextmanager
    async def lifespan(app: GatewayApp) -> AsyncIterator[None]:
        janitor = asyncio.create_task(public.chat.cache_janitor())  # expired response cache entries
        try:
            yield
        finally:
            janitor.cancel()
            await asyncio.gather(janitor, return_exceptions=True)
            await public.chat.settle_writes()  # the response cache's last writes, before the pool closes
            for close in deps.closers:
                await close()

    public = PublicApi(settings, deps)
    routes = [
        *public.routes(),
        *AdminApi(settings, deps).routes(),
        *GuardrailAdminApi(settings, deps, deps.guardrails).routes(),
        *CacheAdminApi(settings, deps).routes(),
        console_mount(settings, deps),
    ]
    handlers = {LlmfleetError: on_error, HTTPException: on_http_error, psycopg.DataError: on_data_error}
    return GatewayApp(routes=routes, exception_handlers=handlers, lifespan=lifespan)
