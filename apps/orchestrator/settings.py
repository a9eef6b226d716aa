"""Settings of one orchestrator replica (environment `LLMFLEET_*`, read once at start)."""

from __future__ import annotations

import os
import socket
import uuid

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from apps.core.nodes.keys import NAMESPACE_PATTERN
from apps.core.scheduling.fairqueue import DEFAULT_MAX_LEN, DEFAULT_MAX_PER_TEAM
from apps.orchestrator.tolerance import UsageTolerance


def default_orchestrator_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class OrchestratorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMFLEET_", extra="ignore", frozen=True)

    host: str = "127.0.0.1"
    port: int = 8081
    # A second port serving only the node WebSocket and health checks (None: nodes use `port`).
    node_port: int | None = Field(default=None, gt=0, lt=65536)
    # A third port serving only `/metrics` and health checks, for Prometheus (None: `port` serves it).
    metrics_port: int | None = Field(default=None, gt=0, lt=65536)
    # A bearer token every `/metrics` scrape must send (empty: none; see apps/core/metrics_access.py).
    metrics_token: SecretStr = SecretStr("")
    orchestrator_id: str = Field(default_factory=default_orchestrator_id)
    database_url: str = "postgresql://postgres@127.0.0.1:5432/postgres"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Prefixes this platform's Redis pub/sub channels (server-wide, not per DB); the gateway's must
    # match. Empty: today's names. Set when platforms or test runs share one Redis server.
    channel_namespace: str = Field(default="", pattern=NAMESPACE_PATTERN)
    internal_token: SecretStr = SecretStr("")
    secret_key: SecretStr = SecretStr("")
    stack: str = "dev"
    redis_max_connections: int = Field(default=200, gt=0)
    # PostgreSQL: settles (settle_workers at a time), registrations, drains, the sweeper.
    pg_pool_max: int = Field(default=10, gt=0)

    # Registration storm control: a token bucket per replica; refusals carry a retry hint
    # that spreads the refused nodes over the following seconds.
    registrations_per_s: float = Field(default=20.0, gt=0)
    registration_burst: int = Field(default=20, gt=0)
    # Registrations whose token does not verify (checked before the bucket above).
    unauthenticated_registrations_per_s: float = Field(default=5.0, gt=0)
    unauthenticated_registration_burst: int = Field(default=10, gt=0)
    register_timeout_s: float = Field(default=10.0, gt=0)
    max_retry_hint_s: float = Field(default=60.0, gt=0)

    heartbeat_interval_s: float = Field(default=5.0, gt=0)
    heartbeat_ttl_s: float = Field(default=15.0, gt=0)
    missed_heartbeats: int = Field(default=2, gt=0)

    # Scheduling.
    queue_limit_s: float = Field(default=30.0, gt=0)
    queue_max_per_model: int = Field(default=DEFAULT_MAX_LEN, gt=0)
    # One team's waiters per model (both classes): its flood is refused before it fills the queue.
    queue_max_per_team: int = Field(default=DEFAULT_MAX_PER_TEAM, gt=0)
    # The share of each node's slots `batch` requests leave free for `interactive` ones (rounded up;
    # a node always takes at least one batch request): an interactive request arriving while batch
    # fills the fleet still finds a slot at once.
    batch_reserve_fraction: float = Field(default=0.125, ge=0, lt=1)
    kv_cache_max: float = Field(default=0.95, gt=0, le=1)
    fleet_refresh_s: float = Field(default=0.5, gt=0)
    # Replicas of a model are started on demand (KEDA scales from zero; true in the k8s manifests):
    # a request for a model no node serves is told when one should be ready (apps/orchestrator/coldstart.py).
    # False (`llmfleet dev`): such a request gets 503 at once, nothing will start.
    scale_from_zero: bool = False
    # A model whose last node left less than this ago (or a replica this young) is not a cold start:
    # its requests queue, the node is probably reconnecting or restarting.
    cold_start_grace_s: float = Field(default=30.0, ge=0)

    # Relay bounds.
    send_queue_frames: int = Field(default=4096, gt=0)
    relay_queue_events: int = Field(default=4096, gt=0)
    cancel_grace_s: float = Field(default=5.0, gt=0)

    # Settlement and sweeping.
    settle_workers: int = Field(default=4, gt=0)
    settle_queue: int = Field(default=10000, gt=0)
    max_request_s: float = Field(default=900.0, gt=0)
    sweep_interval_s: float = Field(default=60.0, gt=0)
    done_record_ttl_s: int = Field(default=86400, gt=0)
    # A node's completion count is accepted up to this many tokens per content event it relayed
    # plus the slack; beyond, the relayed count is settled and the node quarantined
    # (apps/orchestrator/settle.py `UsageTolerance`).
    usage_tokens_per_event: int = Field(default=4, ge=1)
    usage_slack_tokens: int = Field(default=16, ge=0)
    shutdown_grace_s: float = Field(default=10.0, gt=0)
    # Replica shutdown: how long a node handed over may keep relaying on the old socket
    # (apps/orchestrator/handover.py); the pod's grace period must cover it plus shutdown_grace_s.
    handover_deadline_s: float = Field(default=60.0, ge=0)

    @property
    def usage_tolerance(self) -> UsageTolerance:
        return UsageTolerance(self.usage_tokens_per_event, self.usage_slack_tokens)

    @property
    def stale_after_s(self) -> float:
        return self.missed_heartbeats * self.heartbeat_interval_s
