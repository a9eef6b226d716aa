"""The agent's own HTTP surface on `--health-port`: `/livez`, `/readyz`, `/metrics`.

`/livez` is 200 while the process runs (also while draining: a draining agent must not
be killed by its liveness probe). `/readyz` is 200 only when the agent is registered
and not draining, so a Kubernetes preStop/readiness or a load balancer sees the drain.
Metrics use a per-agent `CollectorRegistry`, never the default one. The `Server` header names no
Python or aiohttp version (issue 27: a scanner learns nothing from it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.connected = Gauge(
            "llmfleet_agent_connected", "1 while registered with an orchestrator", registry=r
        )
        self.draining = Gauge("llmfleet_agent_draining", "1 while draining", registry=r)
        self.connects = Counter(
            "llmfleet_agent_connect_attempts", "Connection attempts by result", ["result"], registry=r
        )
        self.assignments = Counter(
            "llmfleet_agent_assignments", "Assignments by outcome", ["outcome"], registry=r
        )
        self.in_flight = Gauge("llmfleet_agent_in_flight", "Requests running on the engine", registry=r)
        self.journal_pending = Gauge(
            "llmfleet_agent_journal_pending", "Finished requests whose done is not acknowledged", registry=r
        )
        self.heartbeats = Counter("llmfleet_agent_heartbeats", "Heartbeats sent", registry=r)
        self.engine_scrape_failures = Counter(
            "llmfleet_agent_engine_scrape_failures", "Failed reads of the engine's /metrics", registry=r
        )
        self.tasks = Gauge("llmfleet_agent_asyncio_tasks", "Live asyncio tasks", registry=r)
        self.tasks.set_function(lambda: len(asyncio.all_tasks()))


SERVER_HEADER = "llmfleet-agent"


async def hide_server_version(_: web.Request, response: web.StreamResponse) -> None:
    response.headers["Server"] = SERVER_HEADER


def health_app(ready: Callable[[], bool], state: Callable[[], str], metrics: AgentMetrics) -> web.Application:
    async def livez(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "state": state()})

    async def readyz(_: web.Request) -> web.Response:
        ok = ready()
        return web.json_response({"ready": ok, "state": state()}, status=200 if ok else 503)

    async def metrics_page(_: web.Request) -> web.Response:
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.on_response_prepare.append(hide_server_version)
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_page)
    return app
