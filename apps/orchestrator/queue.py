"""Per-model FIFO wait queues in front of the node picker.

A request first tries to take a slot directly (when nobody waits for its model); else
it joins its model's queue and only the head of the queue picks, so the order of
service is the order of arrival. Waiters wake on a broadcast (`notify`) sent when a
slot is released here, a node registers or heartbeats here, and after every fleet
refresh (slots released by other replicas). A waiter that reaches its deadline leaves
with 503 + Retry-After; a queue at `max_len` answers 429 + Retry-After at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable

from apps.core.errors import RateLimited, Unavailable
from apps.orchestrator.scheduling.view import NodeView, PickRequest

TryPick = Callable[[PickRequest], Awaitable[NodeView | None]]


class _ModelQueue:
    def __init__(self) -> None:
        self.waiters: deque[object] = deque()
        self.changed = asyncio.Event()

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


class Queues:
    def __init__(
        self,
        try_pick: TryPick,
        *,
        max_len: int,
        on_wait: Callable[[str, float, str], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._try_pick = try_pick
        self._max_len = max_len
        self._on_wait = on_wait
        self._clock = monotonic
        self._queues: dict[str, _ModelQueue] = {}

    def depth(self, model: str) -> int:
        q = self._queues.get(model)
        return len(q.waiters) if q else 0

    def depths(self) -> dict[str, int]:
        return {m: len(q.waiters) for m, q in self._queues.items()}

    def notify(self, model: str | None = None) -> None:
        if model is None:
            for q in self._queues.values():
                q.notify()
        elif model in self._queues:
            self._queues[model].notify()

    async def acquire(
        self, req: PickRequest, timeout_s: float, retry_after_s: float | Callable[[], float]
    ) -> NodeView:
        """A node for `req` (FIFO per model), or a refusal carrying `retry_after_s` (a callable is
        only evaluated for a refusal: the hint looks at the fleet, which most requests never need)."""
        start = self._clock()
        q = self._queues.setdefault(req.model, _ModelQueue())
        if not q.waiters:
            node = await self._try_pick(req)
            if node is not None:
                self._observe(req.model, 0.0, "served")
                return node
        if len(q.waiters) >= self._max_len:
            self._observe(req.model, 0.0, "queue_full")
            raise RateLimited(
                f"the queue for model {req.model!r} is full",
                code="queue_full",
                retry_after=_value(retry_after_s),
            )
        me = object()
        q.waiters.append(me)
        try:
            while True:
                if q.waiters[0] is me:
                    node = await self._try_pick(req)
                    if node is not None:
                        self._observe(req.model, self._clock() - start, "served")
                        return node
                remaining = timeout_s - (self._clock() - start)
                if remaining <= 0:
                    self._observe(req.model, self._clock() - start, "timeout")
                    raise Unavailable(
                        f"no node with free capacity for model {req.model!r} within {timeout_s:g} s",
                        code="queue_timeout",
                        retry_after=_value(retry_after_s),
                    )
                changed = q.changed
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), remaining)
        finally:
            q.waiters.remove(me)
            # The next head must try now: it may fit in capacity this waiter did not take.
            q.notify()

    def _observe(self, model: str, waited: float, outcome: str) -> None:
        if self._on_wait is not None:
            self._on_wait(model, waited, outcome)


def _value(hint: float | Callable[[], float]) -> float:
    return hint() if callable(hint) else hint
