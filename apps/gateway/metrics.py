"""The gateway's Prometheus metrics, on a per-app `CollectorRegistry`."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from apps.netio.fastpath import PathMetrics


def _live_tasks() -> float:
    try:
        return float(len(asyncio.all_tasks()))
    except RuntimeError:
        return 0.0


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.netio = PathMetrics(registry)
        self.requests = Counter(
            "llmfleet_gateway_requests",
            "Chat requests by model and HTTP status",
            ["model", "status"],
            registry=registry,
        )
        self.ttft = Histogram(
            "llmfleet_gateway_ttft_seconds",
            "Time from request to first relayed byte",
            ["model"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30, 60),
            registry=registry,
        )
        self.queue_wait = Histogram(
            "llmfleet_gateway_queue_wait_seconds",
            "Time a request waited in the orchestrator's queue for a node (as the orchestrator reports it)",
            ["model"],
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30),
            registry=registry,
        )
        self.dispatch = Histogram(
            "llmfleet_gateway_dispatch_seconds",
            "Time from admission until the orchestrator answered: queue wait + the engine's first token",
            ["model"],
            buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30),
            registry=registry,
        )
        self.output_tokens = Counter(
            "llmfleet_gateway_output_tokens",
            "Completion tokens reported by the engine",
            ["model"],
            registry=registry,
        )
        self.active_streams = Gauge(
            "llmfleet_gateway_active_streams", "Relays in progress", registry=registry
        )
        self.rejections = Counter(
            "llmfleet_gateway_rejections", "Requests refused, by reason", ["reason"], registry=registry
        )
        self.reservations_open = Gauge(
            "llmfleet_gateway_reservations_open",
            "Ledger reservations this process holds in flight",
            registry=registry,
        )
        self.live_tasks = Gauge("llmfleet_gateway_asyncio_tasks", "Live asyncio tasks", registry=registry)
        self.live_tasks.set_function(_live_tasks)
        self.relayed_chunks = Counter(
            "llmfleet_gateway_relayed_chunks",
            "Upstream reads relayed to clients, by path: direct (written from the upstream socket's "
            "callback) or asgi (through send: first read, slow or departing clients)",
            ["path"],
            registry=registry,
        )
        self.checks = Histogram(
            "llmfleet_gateway_checks_seconds",
            "Redis admission + ledger reservation, by mode: overlapped (run concurrently, a key with "
            "headroom) or in_order (a key at or near a limit, or not seen yet)",
            ["mode"],
            buckets=(0.0005, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
            registry=registry,
        )
        self.overlap_wasted = Counter(
            "llmfleet_gateway_overlap_wasted_reservations",
            "Reservations made alongside an admission that Redis refused (then cancelled)",
            registry=registry,
        )
        self.redis_errors = Counter("llmfleet_gateway_redis_errors", "Redis failures", registry=registry)
        self.pg_errors = Counter("llmfleet_gateway_postgres_errors", "PostgreSQL failures", registry=registry)
