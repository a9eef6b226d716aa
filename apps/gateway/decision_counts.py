"""A request's guardrail decisions counted for the console (docs/guardrails.md, "Where decisions are
counted"): `apps.gateway.screening` collects them in the request's `Exchange` as they are made (and
counts the metric at once); `flush` writes them at the request's end, in one Redis round trip
(`apps.core.guardrails.counts.DecisionCounts`), never before the answer of a streamed request.

Counting never fails a request and never holds it longer than `guardrail_count_timeout_s`: a store
that fails or is slow is a `llmfleet_gateway_redis_errors_total` and the batch is dropped. Only the
decisions' direction, check and action are written, never any text.
"""

from __future__ import annotations

import asyncio

from apps.core.errors import StoreUnavailable
from apps.gateway.deps import GatewayDeps
from apps.gateway.exchange import Exchange
from apps.gateway.metrics import GatewayMetrics
from apps.gateway.settings import GatewaySettings


class DecisionCounter:
    def __init__(self, settings: GatewaySettings, deps: GatewayDeps, metrics: GatewayMetrics) -> None:
        self._s = settings
        self._d = deps
        self._m = metrics

    async def flush(self, ex: Exchange) -> None:
        """Count the request's decisions not counted yet (idempotent: each is counted once)."""
        decisions, ex.decisions = ex.decisions, []
        team_id = ex.principal.team_id if ex.principal is not None else None
        store = self._d.guardrail_counts
        if not decisions or store is None or team_id is None:
            return
        try:
            async with asyncio.timeout(self._s.guardrail_count_timeout_s):
                await store.count(team_id, decisions)
        except (TimeoutError, StoreUnavailable):
            self._m.redis_errors.inc()
