"""The orchestrator's part of the simulation: per-model FIFO queues, the real picker, 503s, retries.

A request tries the picker first when nobody waits for its model, else it joins the model's queue;
a request that waited `slo.queue_limit_s` gets a 503; a finished request frees a slot and drains the
queue; a request whose node died before its first token is retried once on another node (the
orchestrator's retry budget), else it fails.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from apps.core.batching.scheduler import Sequence, StepResult
from apps.core.nodes.state import NodeState
from apps.core.scheduling.picker import rank
from apps.core.scheduling.view import NodeView, PickRequest
from apps.simulate import engines
from apps.simulate.fleet import DRAINING, READY, Pod
from apps.simulate.metrics import Recorder
from apps.simulate.trace import TraceRequest


@dataclass(eq=False, slots=True)
class Flight:
    req: TraceRequest
    rid: str
    orch: int
    queued_at: float | None = None
    submitted: float | None = None
    first_token: float | None = None
    done: float | None = None
    tokens: int = 0
    status: str = ""
    retries: int = 0
    exclude: frozenset[str] = frozenset()
    pod: Pod | None = None


class Orchestrator:
    """The orchestrator's methods of `Simulation` (which owns the state below and the cluster)."""

    queues: dict[str, deque[Flight]]
    by_model: dict[str, list[Pod]]
    flights: list[Flight]
    orchestrators: int
    limit_s: float
    retries: int
    recorder: Recorder

    def _wake_at(self, t: float, pod: Pod) -> None:
        raise NotImplementedError

    def _pod_gone(self, pod: Pod, now: float) -> None:
        raise NotImplementedError

    def _arrive(self, req: TraceRequest, now: float) -> None:
        f = Flight(req, f"r{len(self.flights)}", len(self.flights) % self.orchestrators)
        self.flights.append(f)
        self._submit(f, now)

    def _submit(self, f: Flight, now: float) -> None:
        q = self.queues[f.req.model]
        if not q:
            pod = self._pick(f)
            if pod is not None:
                self._assign(f, pod, now)
                return
        f.queued_at = now if f.queued_at is None else f.queued_at
        q.append(f)

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
        seq = Sequence(f"{f.rid}.{f.retries}", r.prompt_tokens, target, reason, now)
        engines.add(pod, seq, now, self._wake_at)

    def _expire(self, model: str, now: float) -> None:
        q = self.queues[model]
        while q and q[0].queued_at is not None and now - q[0].queued_at >= self.limit_s:
            f = q.popleft()
            f.status, f.done = "503", now
            self.recorder.rejected(f)

    def _drain(self, model: str, now: float) -> None:
        self._expire(model, now)
        q = self.queues[model]
        while q:
            pod = self._pick(q[0])
            if pod is None:
                return
            self._assign(q.popleft(), pod, now)

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
            self.recorder.served(f)
        if result.finished:
            if pod.state == DRAINING and not pod.flights:
                self._pod_gone(pod, now)
            self._drain(pod.model, now)

    def _lost(self, f: Flight, pod: Pod, now: float) -> None:
        if (f.first_token is None or f.first_token > now) and f.retries < self.retries:
            f.retries += 1
            f.exclude = f.exclude | {pod.id}
            f.first_token = None
            self._submit(f, now)
            return
        f.status, f.done = "error", now
        self.recorder.failed(f)
