"""Prometheus metrics of one orchestrator replica, in its own `CollectorRegistry`.

`llmfleet_orchestrator_queue_depth{model}` is the signal KEDA reads to scale the 70B
model from zero (summed over replicas). Node gauges count the nodes whose socket this
replica holds, so a sum over replicas counts every node once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from apps.core.sharing import PriorityClass
from apps.netio.fastpath import PathMetrics

QUEUE_WAIT_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60)


class NodeState(Protocol):
    node_id: str
    location: str
    gpus: int
    models: dict[str, int]
    last_heartbeat: float
    draining: bool
    gpu_util: float | None


class Metrics:
    def __init__(self, models: Iterable[str]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.netio = PathMetrics(r)
        self.nodes = Gauge(
            "llmfleet_orchestrator_nodes", "Nodes connected to this replica, by state", ["state"], registry=r
        )
        self.queue_depth = Gauge(
            "llmfleet_orchestrator_queue_depth",
            "Requests waiting for a node, per model",
            ["model"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "llmfleet_orchestrator_queue_wait_seconds",
            "Time a request waited for a node, per model",
            ["model", "outcome"],
            buckets=QUEUE_WAIT_BUCKETS,
            registry=r,
        )
        # Per team and class (bounded: teams are the ledger's, classes two): the fair queue's view.
        self.team_queue_wait = Histogram(
            "llmfleet_orchestrator_team_queue_wait_seconds",
            "Time a request waited for a node, per model, team and priority class",
            ["model", "team_id", "class", "outcome"],
            buckets=QUEUE_WAIT_BUCKETS,
            registry=r,
        )
        self.team_queue_depth = Gauge(
            "llmfleet_orchestrator_team_queue_depth",
            "Requests waiting for a node on this replica, per model, team and priority class",
            ["model", "team_id", "class"],
            registry=r,
        )
        self.team_queue_oldest = Gauge(
            "llmfleet_orchestrator_team_queue_oldest_wait_seconds",
            "How long the oldest waiting request of a team and class has waited, per model",
            ["model", "team_id", "class"],
            registry=r,
        )
        self.dispatches = Counter(
            "llmfleet_orchestrator_dispatches_total",
            "Dispatches by model and outcome",
            ["model", "outcome"],
            registry=r,
        )
        self.prefix_picks = Counter(
            "llmfleet_orchestrator_prefix_picks_total",
            "Picks by whether the node taken held part of the request's conversation prefix "
            "(hit), another node did (miss), or none did (none)",
            ["model", "outcome"],
            registry=r,
        )
        self.prefix_frames_dropped = Counter(
            "llmfleet_orchestrator_prefix_frames_dropped_total",
            "KV events and prefix announcements refused: an older or superseded socket, a model the node "
            "did not register, a block its events never stored",
            registry=r,
        )
        self.prefix_store_errors = Counter(
            "llmfleet_orchestrator_prefix_store_errors_total",
            "Prefix announcements that could not be written to or read from Redis (routing went on without)",
            registry=r,
        )
        # Canary by model revision (apps/orchestrator/canary.py).
        self.canary_weight = Gauge(
            "llmfleet_orchestrator_canary_weight_percent",
            "The share of conversations a model's canary revision takes, as this replica last read it",
            ["model", "revision"],
            registry=r,
        )
        self.canary_picks = Counter(
            "llmfleet_orchestrator_canary_picks_total",
            "Requests assigned while a model had a live rollout, by the revision of the node they went to",
            ["model", "revision"],
            registry=r,
        )
        self.canary_rollbacks = Counter(
            "llmfleet_orchestrator_canary_rollbacks_total",
            "Canaries this replica rolled back because they broke a bound against the stable revision",
            ["model", "revision"],
            registry=r,
        )
        self.canary_store_errors = Counter(
            "llmfleet_orchestrator_canary_store_errors_total",
            "Reads or rollbacks of the live rollouts that failed (the last rollouts read stay in force)",
            registry=r,
        )
        self.retries = Counter(
            "llmfleet_orchestrator_retries_total",
            "Requests retried on another node",
            ["model", "reason"],
            registry=r,
        )
        self.resumes = Counter(
            "llmfleet_orchestrator_resumes_total",
            "Streams whose node was lost after output started, by why and by what the resume did",
            ["model", "reason", "outcome"],
            registry=r,
        )
        self.resume_prefill_tokens = Counter(
            "llmfleet_orchestrator_resume_prefill_tokens_total",
            "Prompt tokens a resumed stream's second node prefilled (prompt and delivered text): "
            "platform cost, never billed to the team",
            ["model"],
            registry=r,
        )
        self.node_deaths = Counter(
            "llmfleet_orchestrator_node_deaths_total",
            "Node sockets lost other than by drain",
            ["reason"],
            registry=r,
        )
        self.registrations = Counter(
            "llmfleet_orchestrator_registrations_total", "Accepted node registrations", registry=r
        )
        self.registrations_refused = Counter(
            "llmfleet_orchestrator_registrations_refused_total",
            "Refused registrations",
            ["reason"],
            registry=r,
        )
        self.settles = Counter(
            "llmfleet_orchestrator_settles_total", "Ledger settles by outcome", ["outcome"], registry=r
        )
        # Alerting: in normal operation nothing is ever written off (the reservation bounds the cost
        # and the balance covers every open reservation), so any increase pages someone.
        self.writeoff = Counter(
            "llmfleet_ledger_writeoff_microcredits_total",
            "Settled cost the team's balance could not cover (written off)",
            registry=r,
        )
        self.overreported = Counter(
            "llmfleet_orchestrator_usage_overreported_total",
            "Settles where a node reported more tokens than the request's worst case (capped)",
            registry=r,
        )
        # Alerting (`LlmfleetNodeUsageUnrelayed`): an honest node's report agrees with its relay.
        self.unrelayed = Counter(
            "llmfleet_orchestrator_usage_unrelayed_total",
            "Settles where a node reported more completion tokens than the content events it relayed"
            " allow (settled at the relayed count)",
            registry=r,
        )
        self.unrelayed_after_lost_socket = Counter(
            "llmfleet_orchestrator_usage_capped_after_lost_socket_total",
            "Settles of a report sent on a later socket of the node, beyond the content events its"
            " closed sockets relayed (settled at the relayed count; the node is not quarantined)",
            registry=r,
        )
        self.quarantined = Counter(
            "llmfleet_orchestrator_nodes_quarantined_total",
            "Nodes removed from routing for reporting usage beyond a request's worst case or beyond"
            " what they relayed",
            registry=r,
        )
        self.sweeps = Counter(
            "llmfleet_orchestrator_swept_total",
            "Stale reservations handled by the sweeper",
            ["action"],
            registry=r,
        )
        self.forwarded = Counter(
            "llmfleet_orchestrator_forwarded_total", "Pub/sub messages to other replicas", ["op"], registry=r
        )
        self.handovers = Counter(
            "llmfleet_orchestrator_node_handovers_total",
            "Node sockets at this replica's shutdown: handed_over (4011) or closed (1001, no handover)",
            ["outcome"],
            registry=r,
        )
        self.tasks = Gauge(
            "llmfleet_orchestrator_asyncio_tasks", "Live asyncio tasks in this process", registry=r
        )
        # With `tasks`, the leak alert's denominator: tasks that grow while relays do not leak.
        self.active_relays = Gauge(
            "llmfleet_orchestrator_active_relays", "Dispatch relays in progress on this replica", registry=r
        )
        # Per node (this replica's sockets): the on-premises board and the cost report's GPU hours
        # (nobody scrapes a node behind NAT; its heartbeats arrive here).
        node_labels = ["node_id", "location"]
        self.heartbeat_age = Gauge(
            "llmfleet_orchestrator_node_heartbeat_age_seconds",
            "Seconds since the node's last heartbeat",
            node_labels,
            registry=r,
        )
        self.node_gpus = Gauge(
            "llmfleet_orchestrator_node_gpus",
            "GPUs of a connected node, by model",
            [*node_labels, "model"],
            registry=r,
        )
        self.node_gpu_util = Gauge(
            "llmfleet_orchestrator_node_gpu_utilization",
            "GPU utilisation (0-1) the node's heartbeat reported",
            node_labels,
            registry=r,
        )
        self.fleet_nodes = Gauge(
            "llmfleet_orchestrator_fleet_nodes",
            "Connected nodes by location and state",
            ["location", "state"],
            registry=r,
        )
        self.cold_start_pending = Gauge(
            "llmfleet_orchestrator_cold_start_pending",
            "1 while this replica waits for a replica of the model to start from zero (a KEDA demand term)",
            ["model"],
            registry=r,
        )
        for model in models:
            self.queue_depth.labels(model=model).set(0)
            self.cold_start_pending.labels(model=model).set(0)

    def observe_nodes(self, conns: Iterable[NodeState], now: float) -> None:
        """Set the node gauges from this replica's connections (called per scrape)."""
        counts = {"ready": 0, "draining": 0}
        for gauge in (self.heartbeat_age, self.node_gpus, self.node_gpu_util, self.fleet_nodes):
            gauge.clear()  # a node that left must not keep its last value
        for conn in conns:
            state = "draining" if conn.draining else "ready"
            counts[state] += 1
            self.fleet_nodes.labels(location=conn.location, state=state).inc()
            self.heartbeat_age.labels(conn.node_id, conn.location).set(max(0.0, now - conn.last_heartbeat))
            for model in conn.models or {"-": 0}:
                self.node_gpus.labels(conn.node_id, conn.location, model).set(conn.gpus)
            if conn.gpu_util is not None:
                self.node_gpu_util.labels(conn.node_id, conn.location).set(conn.gpu_util)
        for state, n in counts.items():
            self.nodes.labels(state=state).set(n)

    def observe_lanes(
        self, lanes: Mapping[str, Mapping[tuple[PriorityClass, int], tuple[int, float]]]
    ) -> None:
        """Set the per-team queue gauges from the fair queue's lanes (called per fleet refresh)."""
        self.team_queue_depth.clear()  # a lane that emptied must not keep its last value
        self.team_queue_oldest.clear()
        for model, by_lane in lanes.items():
            for (klass, team), (waiting, oldest) in by_lane.items():
                self.team_queue_depth.labels(model, str(team), str(klass)).set(waiting)
                self.team_queue_oldest.labels(model, str(team), str(klass)).set(oldest)

    def render(self) -> bytes:
        self.tasks.set(len(asyncio.all_tasks()))
        return generate_latest(self.registry)
