"""One orchestrator replica's parts, built once and handed to each piece of work as what it uses.

`ControlPlane` is the composition root: it builds the metrics, the fleet view, the fair queues,
the cold starts and the routing (`apps/orchestrator/routing.py`) and answers the queues' picks
(`try_pick`). The dispatch relay and its resume receive `RelayParts`; the node sockets, the
handover and the routes receive their parts by name (`apps/orchestrator/app.py` wires them).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from redis.asyncio import Redis

from apps.core.clock import SYSTEM
from apps.core.ledger.api import Ledger, SettleResult
from apps.core.nodes.store import NodeStore
from apps.core.rollouts import RolloutStore
from apps.core.scheduling.canary import Rollout
from apps.core.scheduling.prefix import PrefixWeights
from apps.orchestrator.canary import Canaries
from apps.orchestrator.coldstart import ColdStarts
from apps.orchestrator.fairshare import TeamService
from apps.orchestrator.fleet import Fleet
from apps.orchestrator.logs import event
from apps.orchestrator.metrics import Metrics
from apps.orchestrator.prefix_feed import PrefixFeed
from apps.orchestrator.prefix_index import PrefixIndex
from apps.orchestrator.prefix_store import PrefixStore
from apps.orchestrator.queue import Queues, Share
from apps.orchestrator.routing import Routing
from apps.orchestrator.scheduling.picker import rank
from apps.orchestrator.scheduling.view import NodeView, PickRequest
from apps.orchestrator.settings import OrchestratorSettings


class SettleFn(Protocol):
    """`apps.core.metering.settle_usage` bound to the ledger and Redis."""

    def __call__(
        self,
        request_id: str,
        prompt_tokens: int,
        completion_tokens: int,
        *,
        resume_prompt_tokens: int = 0,
        cached_prompt_tokens: int = 0,
        node_id: str | None = None,
        model_revision: str | None = None,
    ) -> Awaitable[SettleResult]: ...


@dataclass
class OrchestratorDeps:
    """Everything the replica talks to; built by `run_orchestrator`, by tests with fakes."""

    redis: Redis
    node_store: NodeStore
    ledger: Ledger
    settle: SettleFn  # `apps.core.metering.settle_usage` bound to the ledger and Redis
    models: Collection[str]  # the stack's catalog
    # Each model's expected load time from zero (apps.core.sizing.coldstart); absent: not startable.
    load_time_s: Mapping[str, float] = field(default_factory=dict)
    # Models whose streams resume on another node when theirs is lost (`serving.resume_streams`);
    # None: every catalog model.
    resume_models: Collection[str] | None = None
    # Each model's prefix-aware pick weights (the stack's `serving.prefix_weight`/`prefix_hot_margin`).
    prefix_weights: Mapping[str, PrefixWeights] = field(default_factory=dict)
    wall_clock: Callable[[], float] = field(default=SYSTEM.wall)  # apps.core.clock
    monotonic: Callable[[], float] = field(default=SYSTEM.monotonic)
    # The live rollouts of canary revisions (apps/orchestrator/canary.py); None: no canaries.
    rollouts: RolloutStore | None = None
    # Models whose stack runs a canary Deployment: their rollout until one is stored (weight 0).
    canary_defaults: Mapping[str, Rollout] = field(default_factory=dict)


@dataclass
class Lifecycle:
    """Set once the replica stops (SIGTERM): not ready, no new dispatch, no new registration."""

    stopping: bool = False


@dataclass(frozen=True)
class RelayParts:
    """What a dispatch relay and its resume use (`apps/orchestrator/relay.py`, `resume.py`)."""

    settings: OrchestratorSettings
    lifecycle: Lifecycle
    models: Collection[str]
    resume_models: Collection[str] | None
    prefix_weights: Mapping[str, PrefixWeights]
    redis: Redis
    ledger: Ledger
    settle: SettleFn
    metrics: Metrics
    fleet: Fleet
    cold: ColdStarts
    queues: Queues
    shares: TeamService
    routing: Routing
    prefix_store: PrefixStore
    canaries: Canaries
    monotonic: Callable[[], float]


@dataclass(frozen=True)
class SocketParts:
    """What the node sockets use (`apps/orchestrator/node_ws.py`)."""

    settings: OrchestratorSettings
    lifecycle: Lifecycle
    node_store: NodeStore
    metrics: Metrics
    fleet: Fleet
    routing: Routing
    prefix_feed: PrefixFeed
    wake_queues: Callable[[], None]  # a slot or a node came: the model queues look again
    monotonic: Callable[[], float]


class ControlPlane:
    def __init__(self, settings: OrchestratorSettings, deps: OrchestratorDeps) -> None:
        self.settings = settings
        self.deps = deps
        self.id = settings.orchestrator_id
        self.lifecycle = Lifecycle()
        self.metrics = Metrics(deps.models)
        self.fleet = Fleet(
            deps.redis,
            heartbeat_interval_s=settings.heartbeat_interval_s,
            heartbeat_ttl_s=settings.heartbeat_ttl_s,
            missed_heartbeats=settings.missed_heartbeats,
            max_request_s=settings.max_request_s,
            wall_clock=deps.wall_clock,
        )
        self.shares = TeamService(self.id, deps.wall_clock)
        self.queues = Queues(
            self.try_pick,
            max_len=settings.queue_max_per_model,
            max_per_team=settings.queue_max_per_team,
            service=self.shares,
            on_wait=self._observe_wait,
            monotonic=deps.monotonic,
        )
        self.cold = ColdStarts(
            deps.redis,
            deps.load_time_s,
            scale_from_zero=settings.scale_from_zero,
            pending=self.metrics.cold_start_pending,
            wall_clock=deps.wall_clock,
            grace_s=settings.cold_start_grace_s,
        )
        self.routing = Routing(
            self.id,
            deps.redis,
            self.fleet,
            self.metrics,
            deps.node_store,
            self.queues.notify,
            namespace=settings.channel_namespace,
        )
        self.prefixes = PrefixIndex()  # the prefix caches of the nodes whose sockets are here
        self.prefix_store = PrefixStore(deps.redis)  # what every replica's picks read
        self.canaries = Canaries(
            deps.rollouts, settings.canary_bounds(), self.metrics, deps.monotonic, self.id
        )

    @property
    def stopping(self) -> bool:
        return self.lifecycle.stopping

    @stopping.setter
    def stopping(self, value: bool) -> None:
        self.lifecycle.stopping = value

    def relay_parts(self) -> RelayParts:
        deps = self.deps
        return RelayParts(
            settings=self.settings,
            lifecycle=self.lifecycle,
            models=deps.models,
            resume_models=deps.resume_models,
            prefix_weights=self._prefix_weights(),
            redis=deps.redis,
            ledger=deps.ledger,
            settle=deps.settle,
            metrics=self.metrics,
            fleet=self.fleet,
            cold=self.cold,
            queues=self.queues,
            shares=self.shares,
            routing=self.routing,
            prefix_store=self.prefix_store,
            canaries=self.canaries,
            monotonic=deps.monotonic,
        )

    def socket_parts(self) -> SocketParts:
        return SocketParts(
            settings=self.settings,
            lifecycle=self.lifecycle,
            node_store=self.deps.node_store,
            metrics=self.metrics,
            fleet=self.fleet,
            routing=self.routing,
            prefix_feed=PrefixFeed(self.prefixes, self.prefix_store, self.metrics),
            wake_queues=self.queues.notify,
            monotonic=self.deps.monotonic,
        )

    def _prefix_weights(self) -> dict[str, PrefixWeights]:
        weights = {m: self.deps.prefix_weights.get(m, PrefixWeights()) for m in self.deps.models}
        override = self.settings.prefix_weight
        if override is None:
            return weights
        return {m: PrefixWeights(override, w.hot_margin) for m, w in weights.items()}

    # -- scheduling ---------------------------------------------------------------

    def _observe_wait(self, model: str, share: Share, waited: float, outcome: str) -> None:
        self.metrics.queue_wait.labels(model=model, outcome=outcome).observe(waited)
        self.metrics.queue_depth.labels(model=model).set(self.queues.depth(model))
        self.metrics.team_queue_wait.labels(model, str(share.team), share.klass.value, outcome).observe(
            waited
        )

    async def sync_shares(self) -> None:
        """After a fleet refresh: exchange the fair queue's counters and lanes with the other
        replicas (one Redis round trip) and set the per-team queue gauges."""
        lanes = self.queues.lanes()
        await self.shares.sync(self.deps.redis, self.deps.models, lanes)
        self.metrics.observe_lanes(lanes)

    async def try_pick(self, req: PickRequest) -> NodeView | None:
        self.metrics.queue_depth.labels(model=req.model).set(self.queues.depth(req.model))
        for node in rank(req, self.fleet.snapshot()):
            result = await self.fleet.acquire_slot(
                node,
                req.model,
                req.request_id,
                self.id,
                budget=req.budget,
                resumable=req.resumable,
                capacity=req.capacity(node.models.get(req.model, 0)),
            )
            if result == 1:
                return self.fleet.get(node.node_id) or node
        return None

    async def quarantine(self, node_id: str, reason: str = "usage_overreported") -> None:
        """The node reported usage beyond a request's worst case (`usage_overreported`) or beyond
        what it relayed (`usage_unrelayed`): no new request goes to it (on any replica) until an
        admin issues it a new token."""
        await self.fleet.quarantine(node_id)
        self.metrics.quarantined.inc()
        event("node_quarantined", node_id=node_id, reason=reason)
