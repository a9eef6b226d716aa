"""The orchestrator's HTTP routes as a table, and its background work: `create_app` wires them.

Operator routes (`drain`; `load_model`, retired: 501) take the internal token (`apps.core.protocol.dispatch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web
from redis.exceptions import RedisError

from apps.core.errors import ForwardedError, internal_token_rejected
from apps.core.metrics_access import metrics_refusal
from apps.core.protocol.dispatch import InternalToken
from apps.orchestrator.answers import error_response
from apps.orchestrator.handover import stopping_refusal
from apps.orchestrator.logs import event
from apps.orchestrator.node_ws import NodeSockets
from apps.orchestrator.plane import ControlPlane
from apps.orchestrator.settings import OrchestratorSettings
from apps.orchestrator.settle import Settler
from apps.orchestrator.sweeper import Sweeper

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _local_port(request: web.Request) -> int | None:
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    return int(sockname[1]) if isinstance(sockname, tuple) and len(sockname) >= 2 else None


def _not_connected(node_id: str) -> ForwardedError:
    return ForwardedError(f"node {node_id!r} is not connected", status=404, error_type="not_found_error")


class Routes:
    """Health, metrics and the operator routes of one replica (the parts they read, taken from the
    composition root once)."""

    def __init__(self, plane: ControlPlane) -> None:
        self.id = plane.id
        self.settings = plane.settings
        self.lifecycle = plane.lifecycle
        self.redis = plane.deps.redis
        self.node_store = plane.deps.node_store
        self.models = plane.deps.models
        self.monotonic = plane.deps.monotonic
        self.metrics = plane.metrics
        self.queues = plane.queues
        self.routing = plane.routing
        self._token = InternalToken(plane.settings.internal_token.get_secret_value())

    def table(self) -> list[tuple[str, str, Handler]]:
        return [
            ("POST", "/internal/v1/nodes/{node_id}/drain", self.drain),
            ("POST", "/internal/v1/nodes/{node_id}/load_model", self.load_model),
            ("GET", "/livez", self.livez),
            ("GET", "/readyz", self.readyz),
            ("GET", "/metrics", self.metrics_view),
        ]

    def authorized(self, request: web.Request) -> bool:
        return self._token.accepts(request.headers.get("Authorization"))

    async def livez(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "orchestrator_id": self.id})

    async def readyz(self, _: web.Request) -> web.Response:
        problems: list[str] = []
        try:
            await asyncio.wait_for(self.redis.ping(), 2.0)
        except (RedisError, OSError, TimeoutError):
            problems.append("redis")
        try:
            await asyncio.wait_for(self.node_store.ping(), 2.0)
        except Exception:
            problems.append("postgresql")
        if self.lifecycle.stopping:
            problems.append("stopping")
        status = 503 if problems else 200
        return web.json_response({"ready": not problems, "problems": problems}, status=status)

    async def metrics_view(self, request: web.Request) -> web.Response:
        refusal = metrics_refusal(
            token=self.settings.metrics_token.get_secret_value(),
            authorization=request.headers.get("Authorization"),
            client_host=request.remote,
            on_metrics_port=_local_port(request) == self.settings.metrics_port,
        )
        if refusal is not None:
            return error_response(refusal)
        self.metrics.observe_nodes(self.routing.local.values(), self.monotonic())
        for model in self.models:
            self.metrics.queue_depth.labels(model=model).set(self.queues.depth(model))
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8")

    async def drain(self, request: web.Request) -> web.Response:
        if not self.authorized(request):
            return error_response(internal_token_rejected())
        node_id = request.match_info["node_id"]
        ok = await self.routing.drain_local(node_id) or await self.node_store.request_drain(node_id)
        if not ok:
            return error_response(_not_connected(node_id))
        return web.json_response({"node_id": node_id, "draining": True}, status=202)

    async def load_model(self, request: web.Request) -> web.Response:
        """Retired: 501. A node serves the models its engine was started with; nothing on the node
        could act on the request (the agent ignored it), so accepting it (202) was a lie."""
        if not self.authorized(request):
            return error_response(internal_token_rejected())
        return error_response(
            ForwardedError(
                "load_model is not supported: a node serves the models its engine was started with. "
                "To change them, restart the node's agent and engine with the new model (on EKS: the "
                "model's Deployment); it registers again with its new model list.",
                status=501,
                error_type="not_implemented",
                code="not_implemented",
            )
        )


class Background:
    """The replica's background work (pub/sub reader, fleet refresh, settle workers, sweeper) in one
    TaskGroup owned by the app's cleanup context, and the shutdown that closes node sockets first."""

    def __init__(self, plane: ControlPlane, settler: Settler, sweeper: Sweeper, sockets: NodeSockets) -> None:
        self.plane = plane
        self.settler = settler
        self.sweeper = sweeper
        self.sockets = sockets
        self.settings: OrchestratorSettings = plane.settings

    async def background(self, app: web.Application) -> AsyncIterator[None]:
        stop = asyncio.Event()

        async def refresh_loop() -> None:
            while not stop.is_set():
                try:
                    await self.plane.fleet.refresh()
                    self.plane.routing.check_remote_streams()
                    await self.plane.routing.check_pinned_owners()
                    self.plane.cold.expire()
                    await self.plane.sync_shares()
                    self.plane.queues.notify()
                except RedisError as exc:
                    event("fleet_refresh_failed", logging.WARNING, error=type(exc).__name__)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.settings.fleet_refresh_s)

        async def canary_loop() -> None:  # its errors are counted inside: it never ends the replica
            while not stop.is_set():
                await self.plane.canaries.refresh()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.settings.canary_refresh_s)

        async def supervise() -> None:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.plane.routing.bus.run())
                tg.create_task(refresh_loop())
                tg.create_task(canary_loop())
                tg.create_task(self.settler.run(self.settings.settle_workers))
                tg.create_task(self.sweeper.run(stop))

        task = asyncio.create_task(supervise())
        await self.plane.routing.bus.ready.wait()
        await self.plane.fleet.refresh()
        event("orchestrator_started", orchestrator_id=self.plane.id, models=sorted(self.plane.deps.models))
        yield
        self.plane.stopping = True
        stop.set()
        # Pending settles finish before the workers stop (bounded): dones stay unacked otherwise.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.settler.idle.wait(), self.settings.shutdown_grace_s)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await self.plane.routing.bus.close()

    async def on_shutdown(self, app: web.Application) -> None:
        """Replica shutdown (SIGTERM, then again from the runner's cleanup: a no-op by then)."""
        self.plane.stopping = True
        # Requests waiting here for a node go to another replica (nothing ran for them yet).
        self.plane.queues.close(stopping_refusal)
        await self.sockets.close_all()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.sockets.all_closed.wait(), self.settings.shutdown_grace_s)
