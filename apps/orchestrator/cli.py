"""`llmfleet orchestrator`: run one replica of the node control plane."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from apps.orchestrator.app import run_orchestrator
from apps.orchestrator.logs import configure as configure_logging
from apps.orchestrator.settings import OrchestratorSettings


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None, help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="listen port (default 8081)")
    parser.add_argument(
        "--id", dest="orchestrator_id", default=None, help="replica id (default host-pid-random)"
    )
    parser.add_argument("--log-level", default="INFO")


def run(args: argparse.Namespace) -> int:
    overrides: dict[str, Any] = {
        k: v
        for k, v in (("host", args.host), ("port", args.port), ("orchestrator_id", args.orchestrator_id))
        if v
    }
    settings = OrchestratorSettings(**overrides)
    configure_logging(args.log_level)
    asyncio.run(run_orchestrator(settings))
    return 0
