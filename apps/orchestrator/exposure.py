"""What the orchestrator shows to whom: no version in `Server`, and ports that serve one thing.

`Server` names no Python or aiohttp version (a scanner learns nothing from it). Besides its main
port (dispatch, internal node calls, `/metrics`), a replica may listen on
- `node_port`: only the node WebSocket and the health checks (nodes reach this port alone,
  on premises through the ALB);
- `metrics_port`: only `/metrics` and the health checks (what Prometheus scrapes),
so that a NetworkPolicy can let only the gateway reach the main port's dispatch, only
Prometheus the metrics port, and anyone the node port (`infra/manifests/netpol.py`). On a
restricted port every other path is a 404. Every 404/405 of aiohttp's own is an OpenAI error body.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from apps.core.errors import http_error, unknown_route

SERVER_HEADER = "llmfleet"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def hide_server_version(_: web.Request, response: web.StreamResponse) -> None:
    response.headers["Server"] = SERVER_HEADER


def restrict_ports(allowed: Mapping[int, frozenset[str]]) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Requests arriving on a port of `allowed` may reach only that port's paths."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if allowed:
            sockname = request.transport.get_extra_info("sockname") if request.transport else None
            paths = allowed.get(int(sockname[1])) if sockname is not None else None
            if paths is not None and request.path not in paths:
                raise web.HTTPNotFound()
        return await handler(request)

    return middleware


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own 404/405 (no route, wrong method, a path a restricted port does not serve) in the
    OpenAI error envelope instead of plain text; `Allow` kept."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status not in (404, 405):
            raise
        status, headers, body = http_error(unknown_route(request.method, request.path, exc.status))
        if exc.status == 405 and "Allow" in exc.headers:
            headers["Allow"] = exc.headers["Allow"]
        return web.json_response(body, status=status, headers=headers)
