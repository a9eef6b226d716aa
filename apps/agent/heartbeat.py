"""Building heartbeats from the engine's /metrics and the GPU probe.

If `/metrics` fails while `/health` is fine (vLLM's `/metrics` answers slowly under load)
the last reading is repeated (zeros if the engine never published vllm:* metrics, e.g.
`--disable-log-stats`). If the engine is dead there is no heartbeat at all, so the
orchestrator takes the node out of routing after two missed beats, and `on_down` runs (the KV
events forwarder has the orchestrator forget the engine's prefix index). `gpu_util` is absent
when no GPU telemetry exists; it is never made up.
"""

from __future__ import annotations

from collections.abc import Callable

from apps.agent.engine import EngineClient, EngineLoad
from apps.agent.health import AgentMetrics
from apps.agent.telemetry import GpuProbe
from apps.core.protocol import node as proto


class HeartbeatSource:
    def __init__(
        self,
        engine: EngineClient,
        gpu: GpuProbe,
        metrics: AgentMetrics,
        on_down: Callable[[], None] | None = None,
    ) -> None:
        self._engine = engine
        self._gpu = gpu
        self._metrics = metrics
        self._on_down = on_down
        self._last: EngineLoad | None = None

    async def next(self, running: int, draining: bool) -> proto.Heartbeat | None:
        """The heartbeat to send now, or None when the engine is down."""
        load = await self._engine.load()
        if load is None:
            self._metrics.engine_scrape_failures.inc()
            if not await self._engine.healthy():
                if self._on_down is not None:
                    self._on_down()  # returns at once (the forwarder's reset runs on its own)
                return None
            load = self._last or EngineLoad(queue_depth=0, kv_cache_usage=0.0, running=0)
        self._last = load
        return proto.Heartbeat(
            queue_depth=load.queue_depth,
            kv_cache_usage=load.kv_cache_usage,
            gpu_util=await self._gpu.utilization(),
            running=running,
            draining=draining,
        )
