"""The agent's states and injected dependencies (the things tests replace)."""

from __future__ import annotations

import enum
import importlib.metadata
import ssl
from dataclasses import dataclass, field

from apps.agent.backoff import RandomSource, system_random
from apps.agent.telemetry import GpuProbe
from apps.core.clock import MonotonicClock, SystemClock
from apps.core.errors import LlmfleetError


class AgentState(enum.Enum):
    """STARTING → CONNECTING ⇄ READY; any → DRAINING → STOPPED (never back to READY)."""

    STARTING = "starting"  # waiting for the engine's /health
    CONNECTING = "connecting"  # dialing, registering, or backing off
    READY = "ready"  # registered; takes assignments
    DRAINING = "draining"  # takes nothing new; finishing in-flight work
    STOPPED = "stopped"


class AgentConfigError(LlmfleetError):
    status = 400
    type = "invalid_request_error"
    code = "agent_config"


@dataclass
class AgentDeps:
    # Backoff pauses, engine-wait polling, the wait for the orchestrator's close after `drained`.
    clock: MonotonicClock = field(default_factory=SystemClock)
    rng: RandomSource = field(default_factory=system_random)  # backoff jitter
    gpu_probe: GpuProbe | None = None  # None: DCGM URL, else nvidia-smi, else absent
    ssl_context: ssl.SSLContext | None = None  # None: from settings.ca_bundle / system CAs


def agent_version() -> str:
    try:
        return importlib.metadata.version("llmfleet")
    except importlib.metadata.PackageNotFoundError:
        return "0"
