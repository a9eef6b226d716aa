"""The weighted fair queue's decisions, without I/O or waiting: shared by the orchestrator's
`apps.orchestrator.queue.Queues` (which adds the asyncio waiting) and `llmfleet simulate`.

Per model, requests wait in lanes by (priority class, team), FIFO within a lane. The head is the
first waiter of the lane whose team has received the least weighted service — tokens (prompt +
expected answer) divided by the team's weight, counted across replicas by a `TeamCounters` —
among the interactive lanes; batch lanes are served only when no interactive request waits for
the model here or (as of the last sync) on another replica. A lane that becomes backlogged starts
at the queue's virtual time (the weighted service of the last request served, or of the lanes
already backlogged if higher: start-time fair queueing), so a team back from idle neither waits
behind others' past service nor gets a burst of catch-up service; from there its service counts.

Refusals (`admit`): the model's queue at `max_len`, the team's lanes at `max_per_team`, or a
predicted wait (the team's position over its share of the model's measured drain rate) beyond the
wait limit raise 429 + Retry-After. Retry-After is the team's predicted wait when the drain rate is
known, else the caller's hint.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from apps.core.errors import RateLimited
from apps.core.scheduling.service import TeamCounters
from apps.core.sharing import PriorityClass

Lane = tuple[PriorityClass, int]  # (class, team id)
CLASSES = (PriorityClass.INTERACTIVE, PriorityClass.BATCH)
_RATE_SAMPLES = 64  # serves remembered per model for the drain rate
_RATE_MIN_SAMPLES = 8
MAX_RETRY_AFTER_S = 60.0
# The orchestrator's defaults (`queue_max_per_model`, `queue_max_per_team`), also the simulator's.
DEFAULT_MAX_LEN = 2000
DEFAULT_MAX_PER_TEAM = 500


@dataclass(frozen=True, slots=True)
class Share:
    """Who a request's service is charged to, and how much (tokens)."""

    team: int = 0
    weight: float = 1.0
    klass: PriorityClass = PriorityClass.INTERACTIVE
    cost: float = 1.0

    def correction(self, used_tokens: float) -> float:
        """What to charge when the request ends: the engine's usage (at most the bound charged at
        dispatch) less the bound."""
        return min(used_tokens, self.cost) - self.cost


DEFAULT_SHARE = Share()
WaitObserver = Callable[[str, Share, float, str], None]  # model, share, seconds waited, outcome


class Waiter(Protocol):
    @property
    def share(self) -> Share: ...

    @property
    def since(self) -> float: ...


W = TypeVar("W", bound=Waiter)


class ModelQueue(Generic[W]):
    def __init__(self) -> None:
        self.lanes: dict[Lane, deque[W]] = {}
        # Per backlogged lane: what it starts ahead by, so that its weighted service counts from the
        # queue's virtual time when it became backlogged (start-time fair queueing).
        self.offsets: dict[Lane, float] = {}
        self.vtime = 0.0  # the weighted service of the last request served (monotone)
        self.size = 0
        self.serves: deque[float] = deque(maxlen=_RATE_SAMPLES)

    def team_depth(self, team: int) -> int:
        return sum(len(self.lanes.get((k, team), ())) for k in CLASSES)

    def waiters(self) -> Iterator[W]:
        for lane in self.lanes.values():
            yield from lane


class FairQueue(Generic[W]):
    """Every model's lanes; the caller decides when a waiter tries for a node (`head`) and reports
    what happened (`join`, `leave`, `served`)."""

    def __init__(
        self,
        *,
        max_len: int,
        max_per_team: int | None = None,
        service: TeamCounters | None = None,
        on_wait: WaitObserver | None = None,
        clock: Callable[[], float],
    ) -> None:
        self.max_len = max_len
        self.max_per_team = max_per_team or max_len
        self.service = service if service is not None else TeamCounters()
        self._on_wait = on_wait
        self._clock = clock
        self.queues: dict[str, ModelQueue[W]] = {}

    def queue(self, model: str) -> ModelQueue[W]:
        q = self.queues.get(model)
        if q is None:
            q = self.queues[model] = ModelQueue()
        return q

    # -- views ------------------------------------------------------------------------------

    def depth(self, model: str) -> int:
        q = self.queues.get(model)
        return q.size if q else 0

    def depths(self) -> dict[str, int]:
        return {m: q.size for m, q in self.queues.items()}

    def lanes(self) -> dict[str, dict[Lane, tuple[int, float]]]:
        """Per model and (class, team): waiters and the oldest one's wait in seconds."""
        now = self._clock()
        return {
            model: {lane: (len(w), now - w[0].since) for lane, w in q.lanes.items() if w}
            for model, q in self.queues.items()
        }

    def drain_rate(self, model: str) -> float | None:
        """Requests per second handed slots to for `model` lately (None: unknown)."""
        q = self.queues.get(model)
        if q is None or len(q.serves) < _RATE_MIN_SAMPLES:
            return None
        span = max(q.serves[-1] - q.serves[0], self._clock() - q.serves[-1])
        return (len(q.serves) - 1) / span if span > 0 else None

    def held(self, model: str, share: Share) -> bool:
        """A batch request held back: interactive requests wait for the model on another replica."""
        return share.klass is PriorityClass.BATCH and self.service.interactive_elsewhere(model)

    # -- the head ---------------------------------------------------------------------------

    def _weighted(self, model: str, q: ModelQueue[W], lane: Lane, weight: float) -> float:
        return self.service.served(model, lane[1]) / weight + q.offsets.get(lane, 0.0)

    def head(self, model: str) -> W | None:
        """The waiter whose turn it is to try for a node (None: nobody may try)."""
        q = self.queues.get(model)
        if q is None or not q.size:
            return None
        for klass in CLASSES:
            if klass is PriorityClass.BATCH and self.service.interactive_elsewhere(model):
                return None  # interactive requests wait on another replica: they go first
            best: W | None = None
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

    # -- joining and leaving ----------------------------------------------------------------

    def join(self, model: str, me: W) -> None:
        """Queue `me` at the end of its lane (class, team); a lane that starts now begins at the
        class's fair floor (virtual time), less what its team was already served."""
        q = self.queue(model)
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

    def leave(self, model: str, me: W) -> None:
        q = self.queues[model]
        lane: Lane = (me.share.klass, me.share.team)
        waiters = q.lanes[lane]
        waiters.remove(me)
        q.size -= 1
        if not waiters:
            del q.lanes[lane]
            q.offsets.pop(lane, None)

    def admit(self, model: str, share: Share, timeout_s: float, hint: float | Callable[[], float]) -> None:
        """Raise `RateLimited` (429) when `share` may not join the model's queue."""
        q = self.queue(model)
        if q.size >= self.max_len:
            self.observe(model, share, 0.0, "queue_full")
            raise RateLimited(
                f"the queue for model {model!r} is full",
                code="queue_full",
                retry_after=self.retry_after(model, share, hint),
            )
        position = q.team_depth(share.team) + 1
        predicted = self._predicted_wait(model, q, share, position)
        if position > self.max_per_team or (predicted is not None and predicted > timeout_s):
            self.observe(model, share, 0.0, "team_queue_full")
            raise RateLimited(
                f"your team's queue for model {model!r} is full",
                code="team_queue_full",
                retry_after=self.retry_after(model, share, hint),
            )

    def _predicted_wait(self, model: str, q: ModelQueue[W], share: Share, position: int) -> float | None:
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

    def retry_after(self, model: str, share: Share, hint: float | Callable[[], float]) -> float:
        q = self.queue(model)
        predicted = self._predicted_wait(model, q, share, q.team_depth(share.team) + 1)
        if predicted is None:
            return hint() if callable(hint) else hint
        return float(min(MAX_RETRY_AFTER_S, max(1, math.ceil(predicted))))

    def served(self, model: str, share: Share, start: float) -> None:
        """`share` took a slot for `model` (having asked at `start`): charge its team."""
        q = self.queue(model)
        now = self._clock()
        q.serves.append(now)
        lane = (share.klass, share.team)
        q.vtime = max(q.vtime, self._weighted(model, q, lane, share.weight))
        self.service.charge(model, share.team, share.cost)
        self.observe(model, share, now - start, "served")

    def observe(self, model: str, share: Share, waited: float, outcome: str) -> None:
        if self._on_wait is not None:
            self._on_wait(model, share, waited, outcome)
