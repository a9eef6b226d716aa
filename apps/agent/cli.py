"""`llmfleet agent`: flags → `AgentSettings` → `run_agent`.

The node token is read from the environment (`AgentSettings.node_token`) only; there is
deliberately no flag for it.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from apps.agent.main import run_agent
from apps.agent.settings import AgentSettings
from apps.core.envnames import env_name
from apps.core.errors import LlmfleetError
from apps.core.logs import setup_json_logging


class AgentSettingsError(LlmfleetError):
    status = 400
    type = "invalid_request_error"
    code = "agent_settings"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--orchestrator-url", required=True, help="ws://host:8081/v1/nodes/connect (wss:// in prod)"
    )
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--engine-url", default="http://127.0.0.1:8000", help="the local vLLM/enginesim")
    parser.add_argument("--model", required=True, help="the model name the engine serves")
    parser.add_argument(
        "--model-revision", help="the revision the engine serves (recorded with every request it serves)"
    )
    parser.add_argument("--max-num-seqs", type=int, required=True, help="the engine's --max-num-seqs")
    parser.add_argument("--max-model-len", type=int, help="default: read from the engine's /v1/models")
    parser.add_argument("--gpus", type=int, help="default: counted with nvidia-smi / DCGM, else 0")
    parser.add_argument("--location", choices=["onprem", "cloud"], default="onprem")
    parser.add_argument("--journal", type=Path, help="journal file of unacknowledged dones")
    parser.add_argument("--health-host", help="default 127.0.0.1 (0.0.0.0 in a pod)")
    parser.add_argument("--health-port", type=int, help="serve /livez, /readyz, /metrics on this port")
    parser.add_argument(
        "--ca-bundle", type=Path, help="CA bundle (PEM) that signs the orchestrator's certificate"
    )
    parser.add_argument("--heartbeat-interval", dest="heartbeat_interval_s", type=float)
    parser.add_argument("--drain-timeout", dest="drain_timeout_s", type=float, help="SIGTERM drain bound, s")
    parser.add_argument("--dcgm-url", help="DCGM exporter /metrics URL for GPU utilisation")
    parser.add_argument(
        "--spot-notice-url",
        help="poll this instance-action URL (EC2: http://169.254.169.254/latest/meta-data/spot/instance-action);"
        " a Spot interruption notice starts the drain with a budget that fits it",
    )
    parser.add_argument("--spot-poll", dest="spot_poll_s", type=float, help="seconds between notice polls")
    parser.add_argument(
        "--spot-handoff",
        dest="spot_handoff_s",
        type=float,
        help="seconds of the notice kept for handing off streams",
    )
    parser.add_argument(
        "--kv-events-endpoint",
        help="the engine's KV events (its --kv-events-config endpoint: tcp://127.0.0.1:PORT or ipc://PATH);"
        " forwarded to the orchestrator for prefix-aware routing",
    )
    parser.add_argument("--kv-events-replay-endpoint", help="the engine's KV events replay endpoint")
    parser.add_argument("--log-level", default="info")


def settings_from_args(args: argparse.Namespace) -> AgentSettings:
    given: dict[str, Any] = {
        key: value for key, value in vars(args).items() if value is not None and key not in ("log_level",)
    }
    try:
        return AgentSettings(**given)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in exc.errors()
        )
        if any(e["loc"] == ("node_token",) for e in exc.errors()):
            token = env_name(AgentSettings, "node_token")
            problems = f"{token} is not set (the node token comes from the environment only)"
        raise AgentSettingsError(problems) from None


def run(args: argparse.Namespace) -> int:
    setup_json_logging(args.log_level)
    settings = settings_from_args(args)
    try:
        return asyncio.run(run_agent(settings))
    except* LlmfleetError as group:
        raise _first_leaf(group) from None


def _first_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc
