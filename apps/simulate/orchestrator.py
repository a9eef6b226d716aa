"""The orchestrator's part of the simulation: the production fair queue, picker and retry policy.

Per model, one `apps.core.scheduling.fairqueue.FairQueue` (the orchestrator's weighted fair queue:
lanes by team, start-time fair queueing on tokens, 429 at admission when the queue or the team's
lanes are full or the predicted wait exceeds the limit), the picker of `apps.core.scheduling`, and
the retry policy of `apps.core.scheduling.retry`: a request whose node died before its first
token is retried on another node while it has attempts left, queueing within what is left of
`slo.queue_limit_s` since it arrived (at least 1 s). A waiter still queued at its deadline gets a
503. Every orchestrator replica's queue is modelled as one queue (the replicas share the team
counters; their sync lag is not modelled).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from apps.core.batching.scheduler import Sequence, StepResult
from apps.core.errors import RateLimited
from apps.core.nodes.state import NodeState
from apps.core.scheduling.fairqueue import DEFAULT_SHARE, FairQueue, Share
from apps.core.scheduling.picker import rank
from apps.core.scheduling.retry import RetryBudget, queue_budget
from apps.core.scheduling.view import NodeView, PickRequest
from apps.simulate import engines
from apps.simulate.fleet import DRAINING, READY, Pod
from apps.simulate.metrics import Recorder
from apps.simulate.trace import TraceRequest

RETRY_HINT_S = 5.0  # the Retry-After hint while a node serves the model (not recorded here)


@dataclass(eq=False, slots=True)
class Flight:
    req: TraceRequest
    rid: str
    orch: int
    share: Share = DEFAULT_SHARE
    since: float = 0.0  # when the current try asked for a node
    deadline: float = 0.0  # when the current try's queue wait ends (503)
    waiting: bool = False
    tries: int = 0
    waited: float = 0.0  # seconds in the queue over all tries
    queued_at: float | None = None
    submitted: float | None = None
    first_token: float | None = None
    done: float | None = None
    tokens: int = 0
    status: str = ""
    budget: RetryBudget = field(default_factory=RetryBudget)
    exclude: frozenset[str] = frozenset()
    pod: Pod | None = None


class Orchestrator:
    """The orchestrator's methods of `Simulation` (which owns the state below and the cluster)."""

    fair: FairQueue[Flight]
    teams: dict[str, int]
    team_weight: float
    by_model: dict[str, list[Pod]]
    flights: list[Flight]
    orchestrators: int
    limit_s: float
    recorder: Recorder
    hit_rates: dict[str, float]  # per model: the share of prompt tokens found in the prefix cache

    def _wake_at(self, t: float, pod: Pod) -> None:
        raise NotImplementedError

    def _expire_at(self, f: Flight) -> None:
        raise NotImplementedError

    def _pod_gone(self, pod: Pod, now: float) -> None:
        raise NotImplementedError

    def waiting(self, model: str) -> Iterator[Flight]:
        return self.fair.queue(model).waiters()

    def _arrive(self, req: TraceRequest, now: float) -> None:
        team = self.teams.setdefault(req.team, len(self.teams))
        share = Share(team=team, weight=self.team_weight, cost=float(req.prompt_tokens + req.max_tokens))
        f = Flight(req, f"r{len(self.flights)}", len(self.flights) % self.orchestrators, share)
        self.flights.append(f)
        self._submit(f, now)

    def _submit(self, f: Flight, now: float) -> None:
        """One try for a node (`Queues.acquire`): directly when nobody waits, else in the fair queue."""
        model = f.req.model
        timeout = queue_budget(self.limit_s, now - f.req.t, retrying=bool(f.exclude))
        f.since = now
        f.tries += 1
        if not self.fair.depth(model):
            pod = self._pick(f)
            if pod is not None:
                self.fair.served(model, f.share, now)
                self._assign(f, pod, now)
                return
        try:
            self.fair.admit(model, f.share, timeout, RETRY_HINT_S)
        except RateLimited:
            f.status, f.done = "429", now
            self.recorder.refused(f)
            return
        f.queued_at = now if f.queued_at is None else f.queued_at
        f.deadline = now + timeout
        f.waiting = True
        self.fair.join(model, f)
        self._expire_at(f)
        if self.fair.head(model) is f:  # the head tries at once (another may be blocked by its exclusions)
            self._drain(model, now)

    def _pick(self, f: Flight) -> Pod | None:
        pods = {p.id: p for p in self.by_model[f.req.model] if p.state in (READY, DRAINING)}
        if not pods:
            return None
        views = [self._view(p) for p in pods.values()]
        best = rank(PickRequest(model=f.req.model, request_id=f.rid, exclude=f.exclude), views)
        return pods[best[0].node_id] if best else None

    def _view(self, p: Pod) -> NodeView:
        eng = p.engine
        assert p.node is not None
        return NodeView(
            node_id=p.id,
            location=p.node.location,
            models={p.model: eng.profile.max_num_seqs},
            state=NodeState.READY if p.state == READY else NodeState.DRAINING,
            in_flight=len(p.flights),
            kv_cache_usage=eng.kv_cache_usage,
            queue_depth=len(eng.waiting),
        )

    def _assign(self, f: Flight, pod: Pod, now: float) -> None:
        f.submitted = now
        f.pod = pod
        pod.flights[f.rid] = f
        r = f.req
        target = min(r.answer_tokens, r.max_tokens)
        reason = "stop" if r.answer_tokens <= r.max_tokens else "length"
        seq = Sequence(f"{f.rid}.{f.tries}", r.prompt_tokens, target, reason, now)
        seq.block_hashes = engines.shared_prefix(
            r.prompt_tokens, self.hit_rates.get(r.model, 0.0), pod.engine
        )
        engines.add(pod, seq, now, self._wake_at)

    def _leave(self, f: Flight, now: float) -> None:
        self.fair.leave(f.req.model, f)
        f.waiting = False
        f.waited += now - f.since

    def _expire(self, f: Flight, tries: int, now: float) -> None:
        """The try's queue deadline passed: 503, and the next head tries (`Queues.acquire`)."""
        if not f.waiting or f.tries != tries:
            return
        self._timeout(f, now)
        self._drain(f.req.model, now)

    def _timeout(self, f: Flight, now: float) -> None:
        self._leave(f, now)
        f.status, f.done = "503", now
        self.recorder.rejected(f)

    def _drain(self, model: str, now: float) -> None:
        """Capacity may have freed: the head tries, and while it gets a node the next one."""
        while (f := self.fair.head(model)) is not None:
            pod = self._pick(f)
            if pod is None:
                return
            self.fair.served(model, f.share, f.since)  # before leaving: its lane's offset counts
            self._leave(f, now)
            self._assign(f, pod, now)

    def _deliver(self, pod: Pod, result: StepResult, now: float) -> None:
        for seq in result.first_tokens:
            f = pod.flights.get(seq.request_id.split(".")[0])
            if f is not None:
                f.first_token = seq.first_token_s
        for seq in result.finished:
            f = pod.flights.pop(seq.request_id.split(".")[0], None)
            if f is None:
                continue
            f.done, f.tokens, f.status = now, seq.generated, "ok"
            # The fair queue charged the bound at dispatch; the engine's usage corrects it.
            used = f.req.prompt_tokens + seq.generated
            self.fair.service.charge(pod.model, f.share.team, f.share.correction(used))
            self.recorder.served(f)
        if result.finished:
            if pod.state == DRAINING and not pod.flights:
                self._pod_gone(pod, now)
            self._drain(pod.model, now)

    def _lost(self, f: Flight, pod: Pod, now: float) -> None:
        if f.first_token is None or f.first_token > now:
            f.budget.spend(reached=True)  # the node had the request: an attempt
            if f.budget.left():
                f.exclude = f.exclude | {pod.id}
                f.first_token = None
                self._submit(f, now)
                return
        f.status, f.done = "error", now
        self.recorder.failed(f)
