"""Per-model weighted fair queues (by team, in two priority classes) in front of the node picker.

A request that finds nobody waiting for its model takes a slot directly. Otherwise it joins its
team's lane (FIFO within a team) and only the queue's head picks. The head is the first waiter of
the lane whose team has received the least weighted service — tokens (prompt + expected answer)
divided by the team's weight, counted across replicas by `TeamService` — among the interactive
lanes; batch lanes are served only when no interactive request waits for the model here or (as of
the last sync) on another replica. A lane that becomes backlogged starts at the queue's virtual
time (the weighted service of the last request served, or of the lanes already backlogged if
higher: start-time fair queueing), so a team back from idle neither waits behind others' past
service nor gets a burst of catch-up service; from there its service counts.

Waking: each waiter has its own event; `notify(model)` wakes only the current head (sent when a
slot is released here, a node registers or heartbeats here, and after every fleet refresh), and a
waiter leaving wakes the next head. Refusals: the model's queue at `max_len`, the team's lanes at
`max_per_team`, or a predicted wait (the team's position over its share of the model's measured
drain rate) beyond the wait limit answer 429 + Retry-After at once; a waiter reaching its
deadline leaves with 503 + Retry-After. Retry-After is the team's predicted wait when the drain
rate is known, else the caller's hint.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from apps.core.errors import LlmfleetError, RateLimited, Unavailable
from apps.core.sharing import PriorityClass
from apps.orchestrator.fairshare import TeamService
from apps.orchestrator.scheduling.view import NodeView, PickRequest

TryPick = Callable[[PickRequest], Awaitable[NodeView | None]]
Lane = tuple[PriorityClass, int]  # (class, team id)
_CLASSES = (PriorityClass.INTERACTIVE, PriorityClass.BATCH)
_RATE_SAMPLES = 64  # serves remembered per model for the drain rate
_RATE_MIN_SAMPLES = 8
MAX_RETRY_AFTER_S = 60.0


@dataclass(frozen=True, slots=True)
class Share:
    """Who a request's service is charged to, and how much (tokens)."""

    team: int = 0
    weight: float = 1.0
    klass: PriorityClass = PriorityClass.INTERACTIVE
    cost: float = 1.0


DEFAULT_SHARE = Share()
WaitObserver = Callable[[str, Share, float, str], None]  # model, share, seconds waited, outcome


class _Waiter:
    __slots__ = ("event", "share", "since")

    def __init__(self, share: Share, since: float) -> None:
        self.share = share
        self.since = since
        self.event = asyncio.Event()


class _ModelQueue:
    def __init__(self) -> None:
        self.lanes: dict[Lane, deque[_Waiter]] = {}
        # Per backlogged lane: what it starts ahead by, so that its weighted service counts from the
        # queue's virtual time when it became backlogged (start-time fair queueing).
        self.offsets: dict[Lane, float] = {}
        self.vtime = 0.0  # the weighted service of the last request served (monotone)
        self.size = 0
        self.serves: deque[float] = deque(maxlen=_RATE_SAMPLES)

    def team_depth(self, team: int) -> int:
        return sum(len(self.lanes.get((k, team), ())) for k in _CLASSES)


class Queues:
    def __init__(
        self,
        try_pick: TryPick,
        *,
        max_len: int,
        max_per_team: int | None = None,
        service: TeamService | None = None,
        on_wait: WaitObserver | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._try_pick = try_pick
        self._max_len = max_len
        self._max_per_team = max_per_team or max_len
        self.service = service if service is not None else TeamService()
        self._on_wait = on_wait
        self._clock = monotonic
        self._queues: dict[str, _ModelQueue] = {}
        self._closed: Callable[[], LlmfleetError] | None = None

    def close(self, refusal: Callable[[], LlmfleetError]) -> None:
        """No more waiting here (the replica stops): every waiter, and every later `acquire`,
        raises `refusal()` instead of taking a node."""
        self._closed = refusal
        for q in self._queues.values():
            for waiters in q.lanes.values():
                for waiter in waiters:
                    waiter.event.set()

    # -- views ------------------------------------------------------------------------------

    def depth(self, model: str) -> int:
        q = self._queues.get(model)
        return q.size if q else 0

    def depths(self) -> dict[str, int]:
        return {m: q.size for m, q in self._queues.items()}

    def lanes(self) -> dict[str, dict[Lane, tuple[int, float]]]:
        """Per model and (class, team): waiters and the oldest one's wait in seconds."""
        now = self._clock()
        return {
            model: {lane: (len(w), now - w[0].since) for lane, w in q.lanes.items() if w}
            for model, q in self._queues.items()
        }

    def drain_rate(self, model: str) -> float | None:
        """Requests per second this replica handed slots to for `model` lately (None: unknown)."""
        q = self._queues.get(model)
        if q is None or len(q.serves) < _RATE_MIN_SAMPLES:
            return None
        span = max(q.serves[-1] - q.serves[0], self._clock() - q.serves[-1])
        return (len(q.serves) - 1) / span if span > 0 else None

    # -- waking -----------------------------------------------------------------------------

    def notify(self, model: str | None = None) -> None:
        for name in list(self._queues) if model is None else [model]:
            q = self._queues.get(name)
            if q is not None and q.size:
                head = self._head(name, q)
                if head is not None:
                    head.event.set()

    def _weighted(self, model: str, q: _ModelQueue, lane: Lane, weight: float) -> float:
        return self.service.served(model, lane[1]) / weight + q.offsets.get(lane, 0.0)

    def _head(self, model: str, q: _ModelQueue) -> _Waiter | None:
        for klass in _CLASSES:
            if klass is PriorityClass.BATCH and self.service.interactive_elsewhere(model):
                return None  # interactive requests wait on another replica: they go first
            best: _Waiter | None = None
            best_key = (math.inf, math.inf)
            for lane, waiters in q.lanes.items():
                if lane[0] is not klass or not waiters:
                    continue
                first = waiters[0]
                key = (self._weighted(model, q, lane, first.share.weight), first.since)
                if key < best_key:
                    best, best_key = first, key
            if best is not None:
                return best
        return None

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
        q = self._queues.setdefault(model, _ModelQueue())
        batch_held = share.klass is PriorityClass.BATCH and self.service.interactive_elsewhere(model)
        if not q.size and not batch_held:
            node = await self._try_pick(req)
            if node is not None:
                self._served(model, q, share, start)
                return node
        self._admit(model, q, share, timeout_s, retry_after_s)
        me = _Waiter(share, start)
        lane, waiters = self._join(model, q, me)
        try:
            while True:
                self._refuse_if_closed(model, share, start, continuation)
                head = self._head(model, q)
                if head is me:
                    me.event.clear()
                    node = await self._try_pick(req)
                    if node is not None:
                        self._served(model, q, share, start)
                        return node
                elif me.event.is_set():
                    # Woken as the head, but a sync moved the counters: the wake-up is the new head's.
                    me.event.clear()
                    if head is not None:
                        head.event.set()
                remaining = timeout_s - (self._clock() - start)
                if remaining <= 0:
                    self._observe(model, share, self._clock() - start, "timeout")
                    raise Unavailable(
                        f"no node with free capacity for model {model!r} within {timeout_s:g} s",
                        code="queue_timeout",
                        retry_after=self._retry_after(model, q, share, retry_after_s),
                    )
                # Not `wait_for`: on 3.11 it drops a cancellation that races with the event.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await me.event.wait()
        finally:
            waiters.remove(me)
            q.size -= 1
            if not waiters:
                del q.lanes[lane]
                q.offsets.pop(lane, None)
            # The next head must try now: it may fit in capacity this waiter did not take.
            self.notify(model)

    def _refuse_if_closed(self, model: str, share: Share, since: float | None, continuation: bool) -> None:
        """After `close`: raise its refusal (a waiter's wait observed as "closed"), except for a
        continuation."""
        if self._closed is None or continuation:
            return
        if since is not None:
            self._observe(model, share, self._clock() - since, "closed")
        raise self._closed()

    def _join(self, model: str, q: _ModelQueue, me: _Waiter) -> tuple[Lane, deque[_Waiter]]:
        """Queue `me` at the end of its lane (class, team); a lane that starts now begins at the
        class's fair floor (virtual time), less what its team was already served."""
        share = me.share
        lane: Lane = (share.klass, share.team)
        waiters = q.lanes.get(lane)
        if not waiters:
            waiters = q.lanes[lane] = deque()
            others = [
                self._weighted(model, q, other, w[0].share.weight)
                for other, w in q.lanes.items()
                if other[0] is share.klass and w
            ]
            floor = max(q.vtime, min(others, default=0.0))
            q.offsets[lane] = max(0.0, floor - self.service.served(model, share.team) / share.weight)
        waiters.append(me)
        q.size += 1
        return lane, waiters

    def _admit(
        self, model: str, q: _ModelQueue, share: Share, timeout_s: float, hint: float | Callable[[], float]
    ) -> None:
        if q.size >= self._max_len:
            self._observe(model, share, 0.0, "queue_full")
            raise RateLimited(
                f"the queue for model {model!r} is full",
                code="queue_full",
                retry_after=self._retry_after(model, q, share, hint),
            )
        position = q.team_depth(share.team) + 1
        predicted = self._predicted_wait(model, q, share, position)
        if position > self._max_per_team or (predicted is not None and predicted > timeout_s):
            self._observe(model, share, 0.0, "team_queue_full")
            raise RateLimited(
                f"your team's queue for model {model!r} is full",
                code="team_queue_full",
                retry_after=self._retry_after(model, q, share, hint),
            )

    def _predicted_wait(self, model: str, q: _ModelQueue, share: Share, position: int) -> float | None:
        """Seconds until the team's `position`-th waiter is served: its share of the drain rate."""
        rate = self.drain_rate(model)
        if rate is None:
            return None
        same = [(lane, w) for lane, w in q.lanes.items() if lane[0] is share.klass and w]
        total = sum(w[0].share.weight for lane, w in same if lane[1] != share.team) + share.weight
        if share.klass is PriorityClass.BATCH:  # batch gets what interactive leaves
            ahead = sum(len(w) for lane, w in q.lanes.items() if lane[0] is PriorityClass.INTERACTIVE)
            return (ahead + position * total / share.weight) / rate
        return position * total / share.weight / rate

    def _retry_after(
        self, model: str, q: _ModelQueue, share: Share, hint: float | Callable[[], float]
    ) -> float:
        predicted = self._predicted_wait(model, q, share, q.team_depth(share.team) + 1)
        if predicted is None:
            return hint() if callable(hint) else hint
        return float(min(MAX_RETRY_AFTER_S, max(1, math.ceil(predicted))))

    def _served(self, model: str, q: _ModelQueue, share: Share, start: float) -> None:
        now = self._clock()
        q.serves.append(now)
        lane = (share.klass, share.team)
        q.vtime = max(q.vtime, self._weighted(model, q, lane, share.weight))
        self.service.charge(model, share.team, share.cost)
        self._observe(model, share, now - start, "served")

    def _observe(self, model: str, share: Share, waited: float, outcome: str) -> None:
        if self._on_wait is not None:
            self._on_wait(model, share, waited, outcome)
