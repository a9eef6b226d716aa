"""A dead engine sends no heartbeat, and the agent's `on_down` runs (apps/agent/heartbeat.py): the
KV events forwarder then has the orchestrator forget the engine's prefix index at once."""

from __future__ import annotations

from typing import Any, cast

import pytest

from apps.agent.engine import EngineClient, EngineLoad
from apps.agent.health import AgentMetrics
from apps.agent.heartbeat import HeartbeatSource
from apps.agent.telemetry import NoGpuProbe

pytestmark = pytest.mark.timeout(10)


class Engine:
    """The two answers the heartbeat asks of the engine."""

    def __init__(self, load: EngineLoad | None, healthy: bool) -> None:
        self._load, self._healthy = load, healthy

    async def load(self) -> EngineLoad | None:
        return self._load

    async def healthy(self) -> bool:
        return self._healthy


@pytest.mark.parametrize(
    ("load", "healthy", "beats", "downs"),
    [
        (EngineLoad(queue_depth=1, kv_cache_usage=0.5, running=2), True, True, 0),
        (None, True, True, 0),  # /metrics slow, /health fine: the last reading, not down
        (None, False, False, 1),
    ],
    ids=["serving", "metrics-slow", "dead"],
)
async def test_only_a_dead_engine_runs_on_down(
    load: EngineLoad | None, healthy: bool, beats: bool, downs: int
) -> None:
    calls: list[Any] = []

    def on_down() -> None:
        calls.append(None)

    source = HeartbeatSource(cast(EngineClient, Engine(load, healthy)), NoGpuProbe(), AgentMetrics(), on_down)
    beat = await source.next(running=0, draining=False)
    assert (beat is not None) == beats
    assert len(calls) == downs
