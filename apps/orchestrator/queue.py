"""Per-model weighted fair queues (by team, in two priority classes) in front of the node picker.

The queue's decisions — lanes, the head, admission, the Retry-After, the charge — are
`apps.core.scheduling.fairqueue.FairQueue` (shared with `llmfleet simulate`); this module adds the
waiting. A request that finds nobody waiting for its model takes a slot directly. Otherwise it
joins its team's lane and only the queue's head picks.

Waking: each waiter has its own event; `notify(model)` wakes only the current head (sent when a
slot is released here, a node registers or heartbeats here, and after every fleet refresh), and a
waiter leaving wakes the next head. Refusals: `FairQueue.admit` answers 429 + Retry-After at
once; a waiter reaching its deadline leaves with 503 + Retry-After.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from apps.core.errors import LlmfleetError, Unavailable
from apps.core.protocol.dispatch import DispatchRequest
from apps.core.scheduling.fairqueue import (
    DEFAULT_SHARE,
    MAX_RETRY_AFTER_S,
    FairQueue,
    Lane,
    Share,
    WaitObserver,
)
from apps.core.scheduling.service import TeamCounters
from apps.orchestrator.scheduling.view import NodeView, PickRequest

__all__ = ["DEFAULT_SHARE", "MAX_RETRY_AFTER_S", "Queues", "Share", "TryPick", "share_of"]

TryPick = Callable[[PickRequest], Awaitable[NodeView | None]]


class _Waiter:
    __slots__ = ("event", "share", "since")

    def __init__(self, share: Share, since: float) -> None:
        self.share = share
        self.since = since
        self.event = asyncio.Event()


class Queues:
    def __init__(
        self,
        try_pick: TryPick,
        *,
        max_len: int,
        max_per_team: int | None = None,
        service: TeamCounters | None = None,
        on_wait: WaitObserver | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._try_pick = try_pick
        self._clock = monotonic
        self._fair: FairQueue[_Waiter] = FairQueue(
            max_len=max_len, max_per_team=max_per_team, service=service, on_wait=on_wait, clock=monotonic
        )
        self.service = self._fair.service
        self._closed: Callable[[], LlmfleetError] | None = None

    def close(self, refusal: Callable[[], LlmfleetError]) -> None:
        """No more waiting here (the replica stops): every waiter, and every later `acquire`,
        raises `refusal()` instead of taking a node."""
        self._closed = refusal
        for q in self._fair.queues.values():
            for waiter in q.waiters():
                waiter.event.set()

    # -- views ------------------------------------------------------------------------------

    def depth(self, model: str) -> int:
        return self._fair.depth(model)

    def depths(self) -> dict[str, int]:
        return self._fair.depths()

    def lanes(self) -> dict[str, dict[Lane, tuple[int, float]]]:
        """Per model and (class, team): waiters and the oldest one's wait in seconds."""
        return self._fair.lanes()

    def drain_rate(self, model: str) -> float | None:
        """Requests per second this replica handed slots to for `model` lately (None: unknown)."""
        return self._fair.drain_rate(model)

    # -- waking -----------------------------------------------------------------------------

    def notify(self, model: str | None = None) -> None:
        for name in list(self._fair.queues) if model is None else [model]:
            head = self._fair.head(name)
            if head is not None:
                head.event.set()

    # -- acquire ----------------------------------------------------------------------------

    async def acquire(
        self,
        req: PickRequest,
        timeout_s: float,
        retry_after_s: float | Callable[[], float],
        share: Share = DEFAULT_SHARE,
        *,
        continuation: bool = False,
    ) -> NodeView:
        """A node for `req` in its team's fair turn, or a refusal carrying a Retry-After (the callable
        hint: only for a refusal without a measured drain rate); a `continuation` (a stream resuming
        here) is not refused by `close`."""
        self._refuse_if_closed(req.model, share, None, continuation)
        start = self._clock()
        model = req.model
        fair = self._fair
        q = fair.queue(model)
        if not q.size and not fair.held(model, share):
            node = await self._try_pick(req)
            if node is not None:
                fair.served(model, share, start)
                return node
        fair.admit(model, share, timeout_s, retry_after_s)
        me = _Waiter(share, start)
        fair.join(model, me)
        try:
            while True:
                self._refuse_if_closed(model, share, start, continuation)
                head = fair.head(model)
                if head is me:
                    me.event.clear()
                    node = await self._try_pick(req)
                    if node is not None:
                        fair.served(model, share, start)
                        return node
                elif me.event.is_set():
                    # Woken as the head, but a sync moved the counters: the wake-up is the new head's.
                    me.event.clear()
                    if head is not None:
                        head.event.set()
                remaining = timeout_s - (self._clock() - start)
                if remaining <= 0:
                    fair.observe(model, share, self._clock() - start, "timeout")
                    raise Unavailable(
                        f"no node with free capacity for model {model!r} within {timeout_s:g} s",
                        code="queue_timeout",
                        retry_after=fair.retry_after(model, share, retry_after_s),
                    )
                # Not `wait_for`: on 3.11 it drops a cancellation that races with the event.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await me.event.wait()
        finally:
            fair.leave(model, me)
            # The next head must try now: it may fit in capacity this waiter did not take.
            self.notify(model)

    def _refuse_if_closed(self, model: str, share: Share, since: float | None, continuation: bool) -> None:
        """After `close`: raise its refusal (a waiter's wait observed as "closed"), except for a
        continuation."""
        if self._closed is None or continuation:
            return
        if since is not None:
            self._fair.observe(model, share, self._clock() - since, "closed")
        raise self._closed()


def share_of(dreq: DispatchRequest) -> Share:
    """Who the fair queue charges and how much: the prompt plus the expected answer, in tokens."""
    total = dreq.budget.total
    return Share(
        team=dreq.team_id,
        weight=dreq.team_weight,
        klass=dreq.priority_class,
        cost=float(total) if total is not None else 1.0,
    )
