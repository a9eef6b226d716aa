"""Wiring of one orchestrator replica: `create_app(settings, deps)` and `run_orchestrator(settings)`.

Routes: `WS /v1/nodes/connect`, `POST /internal/v1/dispatch`, `POST
/internal/v1/nodes/{node_id}/drain`, `POST /internal/v1/nodes/{node_id}/load_model` (retired: 501),
`/livez`, `/readyz`, `/metrics`. Background work
(pub/sub reader, fleet refresh, settle workers, sweeper) runs in one TaskGroup owned
by the app's cleanup context; shutdown closes node sockets first (nodes reconnect to
another replica with backoff), then stops the background work, all bounded.
"""

from __future__ import annotations

import asyncio
import functools

from aiohttp import web
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import BlockingConnectionPool, Redis

from apps.core.aio import stop_on_signals
from apps.core.envnames import env_name
from apps.core.errors import LlmfleetError
from apps.core.ledger.pg import PgLedger
from apps.core.metering import settle_usage
from apps.core.nodes.store import NodeStore
from apps.core.protocol.dispatch import DISPATCH_PATH
from apps.core.rollouts import RolloutStore
from apps.core.scheduling.canary import Rollout
from apps.core.scheduling.prefix import PrefixWeights
from apps.core.sizing.coldstart import model_load_times_s
from apps.core.spec import load_spec
from apps.orchestrator.exposure import hide_server_version, openai_errors, restrict_ports
from apps.orchestrator.logs import event
from apps.orchestrator.node_ws import NodeSockets
from apps.orchestrator.plane import ControlPlane, OrchestratorDeps
from apps.orchestrator.ratelimit import TokenBucket
from apps.orchestrator.relay import DispatchHandler
from apps.orchestrator.routes import Background, Routes
from apps.orchestrator.settings import OrchestratorSettings
from apps.orchestrator.settle import Settler
from apps.orchestrator.sweeper import Sweeper

PLANE: web.AppKey[ControlPlane] = web.AppKey("plane", ControlPlane)
SETTLER: web.AppKey[Settler] = web.AppKey("settler", Settler)
SWEEPER: web.AppKey[Sweeper] = web.AppKey("sweeper", Sweeper)
BACKGROUND: web.AppKey[Background] = web.AppKey("background", Background)
NODE_PATH = "/v1/nodes/connect"
HEALTH_PATHS = frozenset({"/livez", "/readyz"})


def _restricted_ports(settings: OrchestratorSettings) -> dict[int, frozenset[str]]:
    """The extra listeners and what each serves (`apps.orchestrator.exposure`)."""
    ports: dict[int, frozenset[str]] = {}
    if settings.node_port is not None:
        ports[settings.node_port] = HEALTH_PATHS | {NODE_PATH}
    if settings.metrics_port is not None:
        ports[settings.metrics_port] = HEALTH_PATHS | {"/metrics"}
    return ports


def _settler(settings: OrchestratorSettings, deps: OrchestratorDeps, plane: ControlPlane) -> Settler:
    return Settler(
        deps.redis,
        plane.fleet,
        deps.settle,
        plane.metrics,
        queue_size=settings.settle_queue,
        record_ttl_s=settings.done_record_ttl_s,
        channel_namespace=settings.channel_namespace,
        on_slot_freed=plane.queues.notify,
        on_overreport=plane.quarantine,
        tolerance=settings.usage_tolerance,
    )


def _sweeper(settings: OrchestratorSettings, deps: OrchestratorDeps, plane: ControlPlane) -> Sweeper:
    return Sweeper(
        deps.redis,
        deps.ledger,
        deps.settle,
        plane.metrics,
        orchestrator_id=plane.id,
        max_request_s=settings.max_request_s,
        interval_s=settings.sweep_interval_s,
    )


def _registration_buckets(
    settings: OrchestratorSettings, deps: OrchestratorDeps
) -> tuple[TokenBucket, TokenBucket]:
    """(verified, unauthenticated): attempts whose token did not verify draw from their own bucket,
    so a flood of bogus registrations never takes the tokens real nodes need."""

    def bucket(rate_per_s: float, burst: int) -> TokenBucket:
        return TokenBucket(rate_per_s, burst, max_hint_s=settings.max_retry_hint_s, clock=deps.monotonic)

    return (
        bucket(settings.registrations_per_s, settings.registration_burst),
        bucket(settings.unauthenticated_registrations_per_s, settings.unauthenticated_registration_burst),
    )


def create_app(settings: OrchestratorSettings, deps: OrchestratorDeps) -> web.Application:
    plane = ControlPlane(settings, deps)
    settler = _settler(settings, deps, plane)
    sweeper = _sweeper(settings, deps, plane)
    sockets = NodeSockets(plane.socket_parts(), settler, *_registration_buckets(settings, deps))
    background = Background(plane, settler, sweeper, sockets)
    app = web.Application(
        client_max_size=8 * 1024 * 1024,
        middlewares=[openai_errors, restrict_ports(_restricted_ports(settings))],
    )
    app.on_response_prepare.append(hide_server_version)
    app[PLANE] = plane
    app[SETTLER] = settler
    app[SWEEPER] = sweeper
    app[BACKGROUND] = background
    app.router.add_get(NODE_PATH, sockets.handle)
    app.router.add_post(DISPATCH_PATH, DispatchHandler(plane.relay_parts()).handle)
    for method, path, handler in Routes(plane).table():
        app.router.add_route(method, path, handler)
    app.cleanup_ctx.append(background.background)
    app.on_shutdown.append(background.on_shutdown)
    return app


async def build_deps(settings: OrchestratorSettings) -> tuple[OrchestratorDeps, AsyncConnectionPool]:
    if not settings.secret_key.get_secret_value():
        name = env_name(OrchestratorSettings, "secret_key")
        raise LlmfleetError(f"{name} is not set (the server key for node token hashes)")
    if not settings.internal_token.get_secret_value():
        name = env_name(OrchestratorSettings, "internal_token")
        raise LlmfleetError(f"{name} is not set (the bearer the gateway uses)")
    spec = load_spec(settings.stack)
    # Autocommit, as the gateway's: the ledger's settle and cancel are single statements (one round
    # trip each instead of BEGIN, statement, COMMIT); multi-statement writes use `transaction()`.
    pool: AsyncConnectionPool = AsyncConnectionPool(
        settings.database_url,
        min_size=1,
        max_size=settings.pg_pool_max,
        kwargs={"autocommit": True},
        open=False,
    )
    await pool.open()
    # A blocking pool: under a burst, callers wait briefly for a connection instead of
    # failing with "Too many connections" (redis-py's default pool raises at 100).
    redis = Redis(
        connection_pool=BlockingConnectionPool.from_url(
            settings.redis_url, max_connections=settings.redis_max_connections, timeout=5
        )
    )
    ledger = PgLedger(pool, {name: m.prices for name, m in spec.models.items()})
    store = NodeStore(
        pool,
        redis,
        settings.secret_key.get_secret_value().encode(),
        heartbeat_interval_s=settings.heartbeat_interval_s,
        channel_namespace=settings.channel_namespace,
    )
    deps = OrchestratorDeps(
        redis=redis,
        node_store=store,
        ledger=ledger,
        settle=functools.partial(settle_usage, ledger, redis),
        models=frozenset(spec.models),
        load_time_s=model_load_times_s(spec),
        resume_models=frozenset(name for name, m in spec.models.items() if m.serving.resume_streams),
        prefix_weights={
            name: PrefixWeights(m.serving.prefix_weight, m.serving.prefix_hot_margin)
            for name, m in spec.models.items()
        },
        rollouts=RolloutStore(pool),
        canary_defaults={
            name: Rollout(name, m.revision, m.canary.revision)
            for name, m in spec.models.items()
            if m.canary is not None
        },
    )
    return deps, pool


async def run_orchestrator(settings: OrchestratorSettings, ready: asyncio.Event | None = None) -> None:
    """Serve until SIGTERM/SIGINT; then close node sockets and stop, bounded."""
    deps, pool = await build_deps(settings)
    app = create_app(settings, deps)
    # The dispatches this replica relays finish while its node sockets are handed over (bounded).
    shutdown_s = settings.shutdown_grace_s + settings.handover_deadline_s
    runner = web.AppRunner(app, shutdown_timeout=shutdown_s, handler_cancellation=True)
    stop = stop_on_signals()
    try:
        await runner.setup()
        await web.TCPSite(runner, settings.host, settings.port).start()
        for extra in _restricted_ports(settings):
            await web.TCPSite(runner, settings.host, extra).start()
        event(
            "listening",
            host=settings.host,
            port=settings.port,
            node_port=settings.node_port,
            metrics_port=settings.metrics_port,
            orchestrator_id=settings.orchestrator_id,
        )
        if ready is not None:
            ready.set()
        await stop.wait()
        # Not ready and handing the node sockets over while still listening (a dispatch or a
        # registration that still reaches this replica is refused and goes elsewhere), then stop:
        # the runner's cleanup must come after, as from its start aiohttp drops what every open
        # connection receives (`pre_shutdown`), a node socket's frames included.
        await app[BACKGROUND].on_shutdown(app)
    finally:
        await runner.cleanup()
        await deps.redis.aclose()
        await pool.close()


class RunningOrchestrator:
    """An orchestrator served in-process on a free port (tests, `llmfleet dev`)."""

    def __init__(self, app: web.Application, runner: web.AppRunner, port: int) -> None:
        self.app = app
        self.runner = runner
        self.port = port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}{NODE_PATH}"

    @property
    def plane(self) -> ControlPlane:
        return self.app[PLANE]

    async def close(self) -> None:
        await self.app[BACKGROUND].on_shutdown(self.app)  # as `run_orchestrator`: hand over first
        await self.runner.cleanup()


async def start_orchestrator(
    settings: OrchestratorSettings, deps: OrchestratorDeps, host: str = "127.0.0.1", port: int = 0
) -> RunningOrchestrator:
    app = create_app(settings, deps)
    runner = web.AppRunner(app, shutdown_timeout=settings.shutdown_grace_s, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    bound = runner.addresses[0][1]  # (host, port) of the socket bound: port 0 picks a free one
    return RunningOrchestrator(app, runner, int(bound))
