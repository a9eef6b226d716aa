"""The sweeper and the partial record it falls back on.

The sweeper (one replica at a time, Redis lock) takes reservations older than the maximum request
time: settles them from a done record (`settle.py`), else from a partial record (written by the
relay when the node vanished mid-stream: `partial_usage`), else cancels them (the node never
reported).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from datetime import UTC, datetime, timedelta

from redis.asyncio import Redis

from apps.core.budget import Usage
from apps.core.ledger.api import Ledger
from apps.core.nodes import keys
from apps.core.protocol.dispatch import DispatchRequest
from apps.orchestrator.logs import event
from apps.orchestrator.metrics import Metrics
from apps.orchestrator.plane import SettleFn


def partial_usage(dreq: DispatchRequest, events: int) -> dict[str, int]:
    """The best counts a relay holds for a stream whose node vanished without a report. The prompt
    as the gateway reserved it: output started, so the prefill ran, and no exact count reached the
    orchestrator (the engine's usage comes with `done`/`error`); the gateway's estimate is an upper
    bound. The completion: one token per event relayed, vLLM's one content event per token (more
    per event when its HTTP side fell behind, the role chunk counted too): the floor the relay saw.
    Both within the budget, so the settle never debits more than was reserved."""
    budget = dreq.budget
    usage = budget.clamp(Usage(budget.prompt_tokens or 0, events)).usage
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens}


class Sweeper:
    def __init__(
        self,
        redis: Redis,
        ledger: Ledger,
        settle: SettleFn,
        metrics: Metrics,
        *,
        orchestrator_id: str,
        max_request_s: float,
        interval_s: float,
    ) -> None:
        self._redis = redis
        self._ledger = ledger
        self._settle = settle
        self._metrics = metrics
        self._id = orchestrator_id
        self._max_request_s = max_request_s
        self._interval = interval_s

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.sweep_once()
            except Exception as exc:
                event("sweep_failed", logging.WARNING, error=type(exc).__name__)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._interval)

    async def sweep_once(self, now: datetime | None = None) -> dict[str, int]:
        counts = {"settled": 0, "settled_partial": 0, "cancelled": 0}
        locked = await self._redis.set(keys.SWEEPER_LOCK, self._id, nx=True, ex=max(1, int(self._interval)))
        if not locked:
            return counts
        try:
            horizon = (now or datetime.now(UTC)) - timedelta(seconds=self._max_request_s)
            for request_id in await self._ledger.stale_reservations(horizon):
                action = await self._sweep_one(request_id)
                counts[action] += 1
                self._metrics.sweeps.labels(action=action).inc()
        finally:
            await self._redis.delete(keys.SWEEPER_LOCK)
        if any(counts.values()):
            event("swept", **counts)
        return counts

    async def _sweep_one(self, request_id: str) -> str:
        done_raw, partial_raw = await self._redis.mget(
            [keys.done_key(request_id), keys.partial_key(request_id)]
        )
        for raw, action in ((done_raw, "settled"), (partial_raw, "settled_partial")):
            if raw is None:
                continue
            record = json.loads(raw)
            prompt = int(record.get("prompt_tokens", 0))
            platform = int(record.get("resume_prompt_tokens", 0))
            result = await self._settle(
                request_id,
                prompt,
                int(record.get("completion_tokens", 0)),
                resume_prompt_tokens=platform,
                # As the settle bills them (apps/orchestrator/settle.py): none for a resumed stream,
                # whose second node's cache saw the resume's prompt (platform cost).
                cached_prompt_tokens=0 if platform else min(int(record.get("cached_tokens", 0)), prompt),
                node_id=record.get("node") or None,  # the audit trail, as the settle records it
                model_revision=record.get("revision") or None,
            )
            self._metrics.writeoff.inc(result.written_off_microcredits)
            return action
        await self._ledger.cancel(request_id)
        return "cancelled"
