"""What the orchestrator shows to whom: no version in `Server`, and an optional node-only port.

`Server` names no Python or aiohttp version (a scanner learns nothing from it). With
`node_port` set, the replica listens on a second port that serves only the node WebSocket and
the health checks: nodes (on premises, through the ALB) reach that port alone, and a
NetworkPolicy lets only the gateway reach the main port's dispatch (and only Prometheus its
`/metrics`; `infra/manifests/netpol.py`). On the node port every other path is a 404.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

SERVER_HEADER = "llmfleet"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def hide_server_version(_: web.Request, response: web.StreamResponse) -> None:
    response.headers["Server"] = SERVER_HEADER


def node_port_only(
    node_port: int | None, allowed: frozenset[str]
) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if node_port is not None and request.path not in allowed:
            sockname = request.transport.get_extra_info("sockname") if request.transport else None
            if sockname is not None and int(sockname[1]) == node_port:
                raise web.HTTPNotFound()
        return await handler(request)

    return middleware
