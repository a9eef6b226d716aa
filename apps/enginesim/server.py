"""Wiring of one simulator instance: settings, `create_app`, `start_enginesim`, `run_enginesim`.

`start_enginesim(settings)` is the in-process entry point for tests (agent, gateway, chaos):
it returns a `RunningEngine` with `.url` once the server listens (or, with `loading_s`, once the
port is bound but refusing connections, the way vLLM loads its model) and `await .close()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

from apps.core.aio import stop_on_signals
from apps.core.logs import setup_json_logging
from apps.enginesim.api import add_routes
from apps.enginesim.devmode import add_dev_routes
from apps.enginesim.engine import Engine
from apps.enginesim.faults import FaultBox, Faults
from apps.enginesim.kvevents import make_publisher
from apps.enginesim.metrics import EngineMetrics
from apps.enginesim.profiles import EngineProfile, get_profile
from apps.enginesim.settings import EngineSimSettings
from apps.enginesim.state import STATE_KEY, SimState, TimingLog

log = logging.getLogger("llmfleet.enginesim")


@dataclass
class EngineSimDeps:
    """Test seams: an explicit profile instead of a named one."""

    profile: EngineProfile | None = None


def resolve_profile(settings: EngineSimSettings, deps: EngineSimDeps) -> EngineProfile:
    if deps.profile is not None:
        base = deps.profile
    elif settings.profile is not None:
        base = get_profile(settings.profile, settings.stack)
    else:
        try:
            base = get_profile(settings.model, settings.stack)
        except ValueError:
            base = get_profile("tiny", settings.stack)
    return base.with_overrides(
        max_num_seqs=settings.max_num_seqs,
        max_model_len=settings.max_model_len,
        num_blocks=settings.num_blocks,
        max_num_batched_tokens=settings.max_num_batched_tokens,
    )


def _report_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("enginesim engine loop crashed: %r; /health now answers 503", task.exception())


ENGINE_TASK_KEY = web.AppKey("enginesim_engine_task", asyncio.Task[None])


def create_app(settings: EngineSimSettings, deps: EngineSimDeps | None = None) -> web.Application:
    deps = deps or EngineSimDeps()
    if settings.speed <= 0:
        raise ValueError(f"speed must be greater than 0, got {settings.speed}")
    profile = resolve_profile(settings, deps)
    metrics = EngineMetrics(
        settings.model,
        profile.max_model_len,
        profile.num_blocks,
        profile.block_size,
        prefix_caching=settings.enable_prefix_caching,
    )
    # vLLM publishes KV cache events only with prefix caching on (no block is ever cached without).
    publisher = (
        make_publisher(settings.kv_events_config, profile.block_size)
        if settings.enable_prefix_caching
        else None
    )
    engine = Engine(
        profile,
        metrics,
        speed=settings.speed,
        scheduling_policy=settings.scheduling_policy,
        kv_events=publisher,
    )
    state = SimState(
        served_model=settings.model,
        profile=profile,
        engine=engine,
        metrics=metrics,
        faults=FaultBox(settings.faults),
        seed=settings.seed,
        timing=TimingLog(settings.timing_log) if settings.timing_log else None,
        prefix_caching=settings.enable_prefix_caching,
        prompt_details=settings.enable_prompt_tokens_details,
        runner=settings.runner,
        embedding_dim=settings.embedding_dim,
    )
    app = web.Application()
    app[STATE_KEY] = state
    add_routes(app)
    if settings.dev_mode:
        add_dev_routes(app)

    async def engine_ctx(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(engine.run(), name="enginesim-engine")
        task.add_done_callback(_report_crash)
        app[ENGINE_TASK_KEY] = task
        yield
        task.cancel()
        # The crash (if any) was logged when it happened; shutdown must not fail on it.
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(asyncio.shield(task), timeout=5)
        if state.timing is not None:
            state.timing.close()  # the lines of streams still open at shutdown
        if publisher is not None:
            publisher.shutdown()

    app.cleanup_ctx.append(engine_ctx)
    return app


@dataclass
class RunningEngine:
    url: str
    port: int
    app: web.Application
    runner: web.AppRunner
    sock: socket.socket
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def state(self) -> SimState:
        return self.app[STATE_KEY]

    def set_faults(self, faults: Faults) -> None:
        self.state.faults.set(faults)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.shield(asyncio.wait_for(self.runner.cleanup(), timeout=10))
        self.sock.close()


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot bind {host}:{port}: {exc.strerror}") from None
    sock.setblocking(False)
    return sock


async def start_enginesim(settings: EngineSimSettings, deps: EngineSimDeps | None = None) -> RunningEngine:
    app = create_app(settings, deps)
    # handler_cancellation: a client disconnect cancels the handler, which aborts the request.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    # Bound but not listening while "loading": connections are refused, as with vLLM.
    sock = _bind(settings.host, settings.port)
    port = sock.getsockname()[1]
    site = web.SockSite(runner, sock)
    running = RunningEngine(
        url=f"http://{settings.host}:{port}", port=port, app=app, runner=runner, sock=sock
    )
    if settings.loading_s > 0:

        async def finish_loading() -> None:
            await asyncio.sleep(settings.loading_s)
            await site.start()
            log.info("enginesim listening after loading", extra={"url": running.url})

        running._tasks.append(asyncio.create_task(finish_loading()))
    else:
        await site.start()
    return running


async def run_enginesim(settings: EngineSimSettings, deps: EngineSimDeps | None = None) -> None:
    """Serve until SIGTERM or SIGINT."""
    running = await start_enginesim(settings, deps)
    prof = running.state.profile
    log.info(
        "enginesim started",
        extra={
            "url": running.url,
            "model": settings.model,
            "profile": prof.name,
            "speed": settings.speed,
            "runner": settings.runner,
        },
    )
    stop = stop_on_signals()
    try:
        await stop.wait()
    finally:
        await running.close()


def setup_logging() -> None:
    setup_json_logging(logging.INFO, "llmfleet")
