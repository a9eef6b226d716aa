"""Who may read `/metrics` (issue 27), and the agent's `Server` header naming no versions."""

from __future__ import annotations

import socket

import aiohttp
import pytest
from aiohttp import web

from apps.agent.health import SERVER_HEADER, AgentMetrics, health_app
from apps.core.errors import AuthenticationFailed, NotFound
from apps.core.metrics_access import metrics_refusal


@pytest.mark.parametrize(
    ("token", "authorization", "host", "on_port", "want"),
    [
        ("", None, "127.0.0.1", False, None),  # llmfleet dev and its Prometheus
        ("", None, "::1", False, None),
        ("", None, "10.0.3.7", True, None),  # the metrics port (a NetworkPolicy guards it)
        ("", None, "10.0.3.7", False, NotFound),  # the API port, from elsewhere
        ("", None, None, False, NotFound),
        ("", "Bearer anything", "203.0.113.9", False, NotFound),
        ("tok", None, "127.0.0.1", False, AuthenticationFailed),  # a token binds everyone
        ("tok", "Bearer nope", "10.0.3.7", True, AuthenticationFailed),
        ("tok", "Bearer tok", "203.0.113.9", False, None),
        ("tok", "Bearer tok", "10.0.3.7", True, None),
    ],
)
def test_metrics_refusal(
    token: str, authorization: str | None, host: str | None, on_port: bool, want: type | None
) -> None:
    got = metrics_refusal(token=token, authorization=authorization, client_host=host, on_metrics_port=on_port)
    assert (type(got) if got is not None else None) is want


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_the_agents_server_header_names_no_versions() -> None:
    """Issue 27: agents answered with `Server: Python/3.11 aiohttp/...`."""
    runner = web.AppRunner(health_app(lambda: True, lambda: "ready", AgentMetrics()), access_log=None)
    await runner.setup()
    port = _free_port()
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
        async with aiohttp.ClientSession() as session:
            for path in ("/livez", "/readyz", "/metrics", "/nowhere"):
                async with session.get(f"http://127.0.0.1:{port}{path}") as resp:
                    assert resp.headers["Server"] == SERVER_HEADER, path
                    assert "Python" not in resp.headers["Server"]
                    assert "aiohttp" not in resp.headers["Server"]
    finally:
        await runner.cleanup()
