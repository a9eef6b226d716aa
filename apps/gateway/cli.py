"""`llmfleet gateway [--host H] [--port P]`: settings from `LLMFLEET_*`, served by uvicorn."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable

import uvicorn

from apps.gateway.app import create_app
from apps.gateway.logs import setup_json_logging
from apps.gateway.settings import GatewaySettings
from apps.gateway.wiring import build_deps


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=None)


async def _serve(settings: GatewaySettings) -> None:
    deps = await build_deps(settings)
    app = create_app(settings, deps)
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_config=None, access_log=False, lifespan="on"
    )
    await uvicorn.Server(config).serve()


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed (about half the per-request CPU of the stdlib loop), else the default."""
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(args: argparse.Namespace) -> int:
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    settings = GatewaySettings(**overrides)
    setup_json_logging()
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_serve(settings))
    return 0
