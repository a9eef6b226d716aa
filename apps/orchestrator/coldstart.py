"""Cold starts answer at once: a request for a model no node serves is told now when waiting
in the queue cannot help, instead of after the full queue limit.

How this replica knows whether a replica of the model is starting (docs/control-plane.md):

* A node of the model is in the fleet (ready, draining or stale: it has a live heartbeat hash),
  or was within the last `grace_s` (an agent restarting or reconnecting, a replica that has just
  started and not yet seen the nodes): not a cold start; the request queues as before.
* No node, and this platform does not start replicas on demand (`LLMFLEET_SCALE_FROM_ZERO`
  false, e.g. `llmfleet dev`, or a stack model with `replicas.max` 0): nothing is starting,
  nothing will: 503 `model_unavailable` at once.
* No node, and the platform scales from zero (KEDA on EKS): the first such request records the
  start in Redis, `coldstart:{model}` = the wall time the replica should be ready (now + the
  model's expected load time from the stack, `apps.core.sizing.coldstart`), `SET NX` with that
  time plus a margin as TTL, so every replica answers with the same ready time. Until then
  this replica's gauge `llmfleet_orchestrator_cold_start_pending{model}` is 1; it is a term of
  the KEDA demand query (infra/manifests/keda.py), which is what asks KEDA for the first
  replica now that the request no longer sits in the queue where KEDA used to see it. If the
  ready time is further away than the request's queue limit: 503 `model_loading` with
  `Retry-After` = the seconds left and a message saying the model is loading; else it queues.
  A start that does not come up in time expires with its record, and the next request asks
  again.

This is the autoscaler's *asked* state, not a node's report: a replica is "starting" from the
moment demand was signalled; the agent registers only once its engine is ready.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from prometheus_client import Gauge
from redis.asyncio import Redis

from apps.core.errors import Unavailable
from apps.core.nodes import keys

# The record outlives the expected ready time by this much, so a slow start is not asked twice.
RECORD_MARGIN_S = 60.0
NOT_SERVED_RETRY_S = 30.0


class ColdStarts:
    def __init__(
        self,
        redis: Redis,
        load_time_s: Mapping[str, float],
        *,
        scale_from_zero: bool,
        pending: Gauge,
        wall_clock: Callable[[], float],
        grace_s: float = 30.0,
    ) -> None:
        self._redis = redis
        self._load_s = dict(load_time_s)
        self._scale_from_zero = scale_from_zero
        self._pending = pending
        self._clock = wall_clock
        self._grace_s = grace_s
        self._started = wall_clock()
        self._last_served: dict[str, float] = {}
        self._ready_at: dict[str, float] = {}  # models this replica signalled demand for

    def served(self, model: str) -> None:
        """A node of the model is in the fleet: no start pending here."""
        self._last_served[model] = self._clock()
        if self._ready_at.pop(model, None) is not None:
            self._pending.labels(model=model).set(0)

    def recently_served(self, model: str) -> bool:
        """A node of the model was in the fleet within `grace_s` (or this replica is that young)."""
        return self._clock() - self._last_served.get(model, self._started) < self._grace_s

    def expire(self) -> None:
        """Drop pending starts past their ready time (called on every fleet refresh)."""
        now = self._clock()
        for model, ready_at in list(self._ready_at.items()):
            if now >= ready_at:
                del self._ready_at[model]
                self._pending.labels(model=model).set(0)

    async def check(self, model: str, queue_limit_s: float) -> None:
        """No node serves `model`: return if waiting `queue_limit_s` can help, else raise the 503."""
        if self.recently_served(model):
            return
        load_s = self._load_s.get(model)
        if not self._scale_from_zero or load_s is None:
            raise Unavailable(
                f"No node serves the model `{model}` and none is starting.",
                code="model_unavailable",
                retry_after=NOT_SERVED_RETRY_S,
            )
        now = self._clock()
        ready_at = await self._start(model, now, load_s)
        self._ready_at[model] = ready_at
        self._pending.labels(model=model).set(1)
        left = ready_at - now
        if left > queue_limit_s:
            raise Unavailable(
                f"The model `{model}` is loading: a replica is starting and should be ready in about "
                f"{math.ceil(left)} s. Retry after that.",
                code="model_loading",
                retry_after=math.ceil(left),
            )

    async def _start(self, model: str, now: float, load_s: float) -> float:
        """The ready time of the start in progress, recording one if there is none (one round trip)."""
        key = keys.coldstart_key(model)
        ttl = math.ceil(load_s + RECORD_MARGIN_S)
        previous = await self._redis.set(key, repr(now + load_s), nx=True, ex=ttl, get=True)
        if previous is None:
            return now + load_s
        try:
            return float(previous)
        except (TypeError, ValueError):
            return now + load_s
