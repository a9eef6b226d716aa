"""Prometheus metrics of one orchestrator replica, in its own `CollectorRegistry`.

`llmfleet_orchestrator_queue_depth{model}` is the signal KEDA reads to scale the 70B
model from zero (summed over replicas). Node gauges count the nodes whose socket this
replica holds, so a sum over replicas counts every node once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from apps.netio.fastpath import PathMetrics

QUEUE_WAIT_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60)


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
        self.dispatches = Counter(
            "llmfleet_orchestrator_dispatches_total",
            "Dispatches by model and outcome",
            ["model", "outcome"],
            registry=r,
        )
        self.retries = Counter(
            "llmfleet_orchestrator_retries_total",
            "Requests retried on another node",
            ["model", "reason"],
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
        self.quarantined = Counter(
            "llmfleet_orchestrator_nodes_quarantined_total",
            "Nodes removed from routing for reporting usage beyond a request's worst case",
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
        self.tasks = Gauge(
            "llmfleet_orchestrator_asyncio_tasks", "Live asyncio tasks in this process", registry=r
        )
        for model in models:
            self.queue_depth.labels(model=model).set(0)

    def render(self) -> bytes:
        self.tasks.set(len(asyncio.all_tasks()))
        return generate_latest(self.registry)
