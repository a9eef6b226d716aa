"""The orchestrator's exposure: `Server` names no version; the node port serves only the node
WebSocket and health checks, the metrics port only `/metrics` and health checks (three real
listeners of one aiohttp app)."""

from __future__ import annotations

import socket

import aiohttp
from aiohttp import web

from apps.orchestrator.exposure import SERVER_HEADER, hide_server_version, restrict_ports


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _ok(_: web.Request) -> web.Response:
    return web.Response(text="ok")


async def test_the_node_and_metrics_ports_serve_only_their_paths_and_server_hides_versions() -> None:
    main_port, node_port, metrics_port = _free_port(), _free_port(), _free_port()
    restricted = {
        node_port: frozenset({"/v1/nodes/connect", "/livez"}),
        metrics_port: frozenset({"/metrics", "/livez"}),
    }
    app = web.Application(middlewares=[restrict_ports(restricted)])
    app.on_response_prepare.append(hide_server_version)
    for path in ("/v1/nodes/connect", "/livez", "/internal/v1/dispatch", "/metrics"):
        app.router.add_get(path, _ok)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", main_port).start()
        await web.TCPSite(runner, "127.0.0.1", node_port).start()
        await web.TCPSite(runner, "127.0.0.1", metrics_port).start()
        async with aiohttp.ClientSession() as session:
            seen: dict[tuple[int, str], int] = {}
            for port in (main_port, node_port, metrics_port):
                for path in ("/v1/nodes/connect", "/livez", "/internal/v1/dispatch", "/metrics"):
                    async with session.get(f"http://127.0.0.1:{port}{path}") as resp:
                        seen[(port, path)] = resp.status
                        assert resp.headers["Server"] == SERVER_HEADER
                        assert "Python" not in resp.headers["Server"]
    finally:
        await runner.cleanup()
    assert all(
        seen[(main_port, p)] == 200 for p in ("/v1/nodes/connect", "/internal/v1/dispatch", "/metrics")
    )
    assert seen[(node_port, "/v1/nodes/connect")] == seen[(node_port, "/livez")] == 200
    assert seen[(node_port, "/internal/v1/dispatch")] == seen[(node_port, "/metrics")] == 404
    # Prometheus' port: metrics and health only; dispatch there is a 404 (the NetworkPolicy lets
    # only the gateway reach the main port's dispatch).
    assert seen[(metrics_port, "/metrics")] == seen[(metrics_port, "/livez")] == 200
    assert seen[(metrics_port, "/internal/v1/dispatch")] == seen[(metrics_port, "/v1/nodes/connect")] == 404
