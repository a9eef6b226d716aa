"""One replica's canaries (apps/orchestrator/canary.py) without PostgreSQL: the stack's canary at weight
0 until a rollout is stored, the stored one winning, a probe's sample, and a store that fails."""

from __future__ import annotations

import pytest
from psycopg import OperationalError

from apps.core.errors import Unavailable
from apps.core.nodes.state import NodeState
from apps.core.protocol.dispatch import DispatchRequest
from apps.core.scheduling.canary import Bounds, Rollout
from apps.core.scheduling.view import NodeView
from apps.orchestrator.canary import Canaries
from apps.orchestrator.metrics import Metrics

pytestmark = pytest.mark.timeout(30)


class Store:
    def __init__(self, live: dict[str, Rollout] | Exception) -> None:
        self.result = live

    async def live(self) -> dict[str, Rollout]:
        if isinstance(self.result, Exception):
            raise self.result
        return self.result

    async def rollback(self, *args: object) -> bool:
        return True


def _canaries(store: Store | None, now: list[float]) -> Canaries:
    defaults = {"m": Rollout("m", "r1", "r2")}
    return Canaries(store, Bounds(min_requests=1, hold_s=0), Metrics(["m"]), lambda: now[0], "o", defaults)  # type: ignore[arg-type]


async def test_the_stacks_canary_gets_nothing_until_a_rollout_gives_it_a_share() -> None:
    now = [0.0]
    canaries = _canaries(None, now)
    await canaries.refresh()
    assert canaries.rollouts["m"] == Rollout("m", "r1", "r2", 0.0)  # its nodes run; no conversation
    store = Store({"m": Rollout("m", "r1", "r2", 5.0)})
    canaries = _canaries(store, now)
    await canaries.refresh()
    assert canaries.rollouts["m"].weight == 5.0  # the stored rollout wins
    store.result = OperationalError("down")
    await canaries.refresh()  # the last rollouts read stay in force, the failure is counted
    assert canaries.rollouts["m"].weight == 5.0
    assert canaries.metrics.canary_store_errors._value.get() == 1


async def test_a_probe_reports_once_and_only_for_a_live_revision() -> None:
    now = [10.0]
    canaries = _canaries(Store({"m": Rollout("m", "r1", "r2", 50.0)}), now)
    await canaries.refresh()
    probe = canaries.probe("m", "r2")
    now[0] = 10.5
    probe.first()
    now[0] = 11.5
    probe.done(20)
    probe.failed()  # already reported: nothing more
    stats = canaries.judges["m"].stats("r2", now[0])
    assert (stats.n, stats.ttft_p95, stats.tokens_per_s_p50, stats.error_ratio) == (1, 0.5, 20.0, 0.0)
    canaries.probe("m", "r9").failed()  # a revision not live: not counted
    canaries.probe("other", "r2").failed()
    assert canaries.judges["m"].stats("r9", now[0]).n == 0
    assert canaries.metrics.canary_picks.labels("m", "r2")._value.get() == 1


async def test_an_admins_pin_wins_over_the_rollout_and_feeds_no_judge() -> None:
    """`llmfleet model eval` pins its golden set to a candidate (`DispatchRequest.revision`): that
    revision or a 503 at once (no wait in the queue for a node that never comes), never the
    canary judge's sample."""
    now = [10.0]
    canaries = _canaries(Store({"m": Rollout("m", "r1", "r2", 50.0)}), now)
    await canaries.refresh()
    nodes = [
        NodeView(f"n-{r}", "onprem", {"m": 4}, NodeState.READY, revisions={"m": r})
        for r in ("r1", "r2", "r3")
    ]
    body = {"messages": [{"role": "user", "content": "hi"}]}
    pinned = DispatchRequest(request_id="q", team_id=1, model="m", body=body, revision="r3")
    assert canaries.allowed(pinned, nodes) == frozenset({"r3"})  # not live: an evaluation's candidate
    with pytest.raises(Unavailable) as refused:
        canaries.allowed(pinned, nodes[:2])
    assert (refused.value.status, refused.value.code) == (503, "revision_not_served")
    draining = [*nodes[:2], NodeView("n-r3", "onprem", {"m": 4}, NodeState.DRAINING, revisions={"m": "r3"})]
    with pytest.raises(Unavailable):
        canaries.allowed(pinned, draining)
    unpinned = DispatchRequest(request_id="q", team_id=1, model="m", body=body)
    assert canaries.allowed(unpinned, nodes) in (frozenset({"r1"}), frozenset({"r2"}))

    probe = canaries.probe("m", "r2", pinned=True)
    probe.first()
    probe.done(5)
    assert canaries.judges["m"].stats("r2", now[0]).n == 0
    assert canaries.metrics.canary_picks.labels("m", "r2")._value.get() == 0
