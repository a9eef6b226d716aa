"""Canary by model revision on one replica (issue 30 item 3): the live rollouts (read from PostgreSQL
every `canary_refresh_s`), which revisions a new request may go to, what each attempt showed (TTFT,
output tokens/s, failure) and the automatic rollback of a canary that broke its bounds for
`canary_hold_s` (`apps/core/scheduling/canary.py` has the rules).

Each replica judges the requests it relayed; the first replica to find a breach rolls the canary back
(`RolloutStore.rollback` names the revision: the others find nothing left to do) and counts it in
`llmfleet_orchestrator_canary_rollbacks_total`, which the `LlmfleetCanaryRolledBack` alert reads.
The store unreachable: the last rollouts read stay in force, counted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from psycopg import Error as PgError

from apps.core.errors import Unavailable
from apps.core.nodes.state import ROUTABLE
from apps.core.protocol.dispatch import DispatchRequest
from apps.core.rollouts import RolloutStore
from apps.core.scheduling.canary import Bounds, CanaryJudge, Rollout, Sample, allowed, conversation_key
from apps.orchestrator.logs import event
from apps.orchestrator.metrics import Metrics
from apps.orchestrator.scheduling.view import NodeView


@dataclass
class Probe:
    """One attempt's sample, reported once: at its end, or when it failed."""

    report: Callable[[Sample], None] | None
    monotonic: Callable[[], float]
    started: float
    first_at: float | None = field(default=None)

    def first(self) -> None:
        if self.first_at is None:
            self.first_at = self.monotonic()

    def done(self, completion_tokens: int) -> None:
        now = self.monotonic()
        ttft = None if self.first_at is None else self.first_at - self.started
        span = now - (self.first_at if self.first_at is not None else self.started)
        tps = completion_tokens / span if span > 0 and completion_tokens > 0 else None
        self._send(Sample(now, ttft, tps, ok=True))

    def failed(self) -> None:
        ttft = None if self.first_at is None else self.first_at - self.started
        self._send(Sample(self.monotonic(), ttft, None, ok=False))

    def _send(self, sample: Sample) -> None:
        report, self.report = self.report, None
        if report is not None:
            report(sample)


class Canaries:
    def __init__(
        self,
        store: RolloutStore | None,
        bounds: Bounds,
        metrics: Metrics,
        monotonic: Callable[[], float],
        actor: str,
        defaults: Mapping[str, Rollout] | None = None,
    ) -> None:
        self.store = store
        # A model whose stack runs a canary Deployment but has no rollout yet: its canary at weight 0
        # (its nodes get nothing before `llmfleet model canary` gives it a share).
        self.defaults = dict(defaults or {})
        self.bounds = bounds
        self.metrics = metrics
        self.monotonic = monotonic
        self.actor = actor  # who the rollback events name: this replica
        self.rollouts: dict[str, Rollout] = {}
        self.judges: dict[str, CanaryJudge] = {}

    async def refresh(self) -> None:
        """Read the live rollouts (nothing without a store) and judge the canaries."""
        if self.store is None:
            self.apply({})
            return
        try:
            self.apply(await self.store.live())
        except (PgError, OSError) as exc:
            self.metrics.canary_store_errors.inc()
            event("canary_store_failed", logging.WARNING, error=type(exc).__name__)
            return
        await self.judge()

    def apply(self, stored: Mapping[str, Rollout]) -> None:
        live = {**self.defaults, **stored}
        for model in set(self.rollouts) - set(live):
            self._forget(model)
        for model, rollout in live.items():
            old = self.rollouts.get(model)
            if old is not None and old.live() != rollout.live():
                self._forget(model)  # other revisions: a new canary starts from no samples
            self.rollouts[model] = rollout
            if rollout.canary is not None:
                judge = self.judges.setdefault(model, CanaryJudge(rollout, self.bounds))
                judge.rollout = rollout
                self.metrics.canary_weight.labels(model, rollout.canary).set(rollout.weight)

    def allowed(self, dreq: DispatchRequest, nodes: Iterable[NodeView]) -> frozenset[str] | None:
        """The revisions a new request may go to (None: the model has no rollout: any). An admin's
        pin (`DispatchRequest.revision`, an evaluation) wins: that revision or nothing."""
        serving = [
            n.revisions.get(dreq.model, "") for n in nodes if dreq.model in n.models and n.state in ROUTABLE
        ]
        if dreq.revision is not None:
            if dreq.revision not in serving:  # at once, not after the queue's wait for a node never coming
                raise Unavailable(
                    f"No node serves `{dreq.model}` at revision {dreq.revision}.", code="revision_not_served"
                )
            return frozenset({dreq.revision})
        rollout = self.rollouts.get(dreq.model)
        if rollout is None:
            return None
        return allowed(rollout, conversation_key(dreq.body, dreq.team_id, dreq.request_id), serving)

    def probe(self, model: str, revision: str | None, *, pinned: bool = False) -> Probe:
        """What an attempt on a node of `revision` reports (nothing when no canary of the model is
        live, the node serves neither of its revisions, or the request was pinned to its revision:
        an evaluation's traffic is not the canary's)."""
        judge = None if pinned else self.judges.get(model)
        report = None
        if judge is not None and revision in judge.rollout.live():
            self.metrics.canary_picks.labels(model, revision).inc()
            report = _reporter(judge, revision)
        return Probe(report, self.monotonic, self.monotonic())

    async def judge(self) -> None:
        """Roll back every canary whose breach has held for `hold_s`."""
        assert self.store is not None
        for model, judge in list(self.judges.items()):
            reason = judge.verdict(self.monotonic())
            canary = judge.rollout.canary
            if reason is None or canary is None:
                continue
            try:
                done = await self.store.rollback(model, canary, self.actor, f"automatic: {reason}")
            except (PgError, OSError) as exc:
                self.metrics.canary_store_errors.inc()
                event("canary_store_failed", logging.WARNING, error=type(exc).__name__)
                continue
            if done:
                self.metrics.canary_rollbacks.labels(model, canary).inc()
                event("canary_rolled_back", logging.WARNING, model=model, revision=canary, reason=reason)
            self.rollouts[model] = Rollout(model, judge.rollout.stable)  # at once, not at the next read
            self._forget(model)

    def _forget(self, model: str) -> None:
        judge = self.judges.pop(model, None)
        if judge is not None and judge.rollout.canary is not None:
            self.metrics.canary_weight.labels(model, judge.rollout.canary).set(0)


def _reporter(judge: CanaryJudge, revision: str) -> Callable[[Sample], None]:
    def report(sample: Sample) -> None:
        judge.observe(revision, sample)

    return report
