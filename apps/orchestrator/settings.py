"""Settings of one orchestrator replica (environment `LLMFLEET_*`, read once at start).

Each field's environment name is `LLMFLEET_` + its name in capitals (apps/core/envnames.py);
docs/configuration.md lists them (generated: tools/gen_config_docs.py).
"""

from __future__ import annotations

import os
import socket
import uuid

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from apps.core.nodes.keys import NAMESPACE_PATTERN
from apps.core.scheduling.canary import Bounds
from apps.core.scheduling.fairqueue import DEFAULT_MAX_LEN, DEFAULT_MAX_PER_TEAM
from apps.orchestrator.tolerance import UsageTolerance


def default_orchestrator_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class OrchestratorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMFLEET_", extra="ignore", frozen=True)

    host: str = Field("127.0.0.1", description="address the orchestrator listens on (`--host` wins)")
    port: int = Field(
        8081, description="the orchestrator's port: gateway calls, nodes, health (`--port` wins)"
    )
    # A second port serving only the node WebSocket and health checks (None: nodes use `port`).
    node_port: int | None = Field(
        default=None,
        gt=0,
        lt=65536,
        description="a second port serving only the node WebSocket and health checks",
    )
    # A third port serving only `/metrics` and health checks, for Prometheus (None: `port` serves it).
    metrics_port: int | None = Field(
        default=None,
        gt=0,
        lt=65536,
        description="a port serving only `/metrics` and health checks (unset: `port`)",
    )
    # A bearer token every `/metrics` scrape must send (empty: none; see apps/core/metrics_access.py).
    metrics_token: SecretStr = Field(
        SecretStr(""), description="bearer token every `/metrics` scrape must send"
    )
    orchestrator_id: str = Field(
        default_factory=default_orchestrator_id, description="this replica's id (default: host-pid-random)"
    )
    database_url: str = Field("postgresql://postgres@127.0.0.1:5432/postgres", description="PostgreSQL URL")
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis URL")
    # Prefixes this platform's Redis pub/sub channels (server-wide, not per DB); the gateway's must
    # match. Empty: today's names. Set when platforms or test runs share one Redis server.
    channel_namespace: str = Field(
        default="",
        pattern=NAMESPACE_PATTERN,
        description="prefix of the Redis pub/sub channels (the gateway's must match)",
    )
    internal_token: SecretStr = Field(
        SecretStr(""), description="bearer the gateway sends on `/internal/*` (required)"
    )
    secret_key: SecretStr = Field(SecretStr(""), description="server key of the node token hashes (required)")
    stack: str = Field("dev", description="the stack whose spec applies (`stacks/<stack>.yaml`)")
    redis_max_connections: int = Field(default=200, gt=0, description="Redis connection pool size")
    # PostgreSQL: settles (settle_workers at a time), registrations, drains, the sweeper.
    pg_pool_max: int = Field(
        default=10, gt=0, description="PostgreSQL pool size (settles, registrations, sweeper)"
    )

    # Registration storm control: a token bucket per replica; refusals carry a retry hint
    # that spreads the refused nodes over the following seconds.
    registrations_per_s: float = Field(
        default=20.0, gt=0, description="node registrations admitted per second"
    )
    registration_burst: int = Field(default=20, gt=0, description="burst of the registration token bucket")
    # Registrations whose token does not verify (checked before the bucket above).
    unauthenticated_registrations_per_s: float = Field(
        default=5.0, gt=0, description="registrations with a bad token handled per second"
    )
    unauthenticated_registration_burst: int = Field(
        default=10, gt=0, description="burst of the bad-token registration bucket"
    )
    register_timeout_s: float = Field(default=10.0, gt=0, description="bound of one node registration")
    max_retry_hint_s: float = Field(
        default=60.0, gt=0, description="the longest retry hint a refused node gets"
    )

    heartbeat_interval_s: float = Field(default=5.0, gt=0, description="heartbeat interval expected of nodes")
    heartbeat_ttl_s: float = Field(
        default=15.0, gt=0, description="TTL of a node's heartbeat record in Redis"
    )
    missed_heartbeats: int = Field(default=2, gt=0, description="heartbeats missed before a node is stale")

    # Scheduling.
    queue_limit_s: float = Field(default=30.0, gt=0, description="longest wait in a model's queue for a node")
    queue_max_per_model: int = Field(
        default=DEFAULT_MAX_LEN, gt=0, description="waiters per model (beyond: refused)"
    )
    # One team's waiters per model (both classes): its flood is refused before it fills the queue.
    queue_max_per_team: int = Field(
        default=DEFAULT_MAX_PER_TEAM, gt=0, description="one team's waiters per model"
    )
    # The share of each node's slots `batch` requests leave free for `interactive` ones (rounded up;
    # a node always takes at least one batch request): an interactive request arriving while batch
    # fills the fleet still finds a slot at once.
    batch_reserve_fraction: float = Field(
        default=0.125,
        ge=0,
        lt=1,
        description="share of each node's slots batch requests leave to interactive ones",
    )
    kv_cache_max: float = Field(
        default=0.95, gt=0, le=1, description="KV-cache use above which a node gets no work"
    )
    # Prefix-aware picks: the stack's per-model `serving.prefix_weight` unless this overrides it for
    # every model (experiments, `tools/bench prefix`'s least-loaded runs: 0).
    prefix_weight: float | None = Field(
        default=None,
        ge=0,
        description="overrides every model's serving.prefix_weight (0: prefix-aware picks off)",
    )
    fleet_refresh_s: float = Field(default=0.5, gt=0, description="how often the fleet view is refreshed")
    # Replicas of a model are started on demand (KEDA scales from zero; true in the k8s manifests):
    # a request for a model no node serves is told when one should be ready (apps/orchestrator/coldstart.py).
    # False (`llmfleet dev`): such a request gets 503 at once, nothing will start.
    scale_from_zero: bool = Field(
        False, description="replicas start on demand: a request for a model without a node waits for one"
    )
    # A model whose last node left less than this ago (or a replica this young) is not a cold start:
    # its requests queue, the node is probably reconnecting or restarting.
    cold_start_grace_s: float = Field(
        default=30.0, ge=0, description="a model whose last node left this recently is not a cold start"
    )

    # Relay bounds.
    send_queue_frames: int = Field(default=4096, gt=0, description="frames queued to one node's socket")
    relay_queue_events: int = Field(default=4096, gt=0, description="events queued for one relayed request")
    cancel_grace_s: float = Field(
        default=5.0, gt=0, description="how long a cancelled request may take to end"
    )

    # Settlement and sweeping.
    settle_workers: int = Field(default=4, gt=0, description="settlements running at a time")
    settle_queue: int = Field(default=10000, gt=0, description="settlements queued")
    max_request_s: float = Field(
        default=900.0, gt=0, description="longest a request may run (the sweeper settles after)"
    )
    sweep_interval_s: float = Field(default=60.0, gt=0, description="how often the sweeper runs")
    done_record_ttl_s: int = Field(
        default=86400, gt=0, description="how long a finished request's record is kept"
    )
    # A node's completion count is accepted up to this many tokens per content event it relayed
    # plus the slack; beyond, the relayed count is settled and the node quarantined
    # (apps/orchestrator/settle.py `UsageTolerance`).
    usage_tokens_per_event: int = Field(
        default=4, ge=1, description="completion tokens accepted per content event a node relayed"
    )
    usage_slack_tokens: int = Field(default=16, ge=0, description="completion tokens accepted beyond that")
    shutdown_grace_s: float = Field(default=10.0, gt=0, description="bound of the shutdown after SIGTERM")
    # Replica shutdown: how long a node handed over may keep relaying on the old socket
    # (apps/orchestrator/handover.py); the pod's grace period must cover it plus shutdown_grace_s.
    handover_deadline_s: float = Field(
        default=60.0, ge=0, description="how long a node handed over may keep relaying on the old socket"
    )
    # apps/netio/fastpath.py: `on`, `off` or a comma-separated list of the fast paths to keep on.
    netio_fastpaths: str = Field(
        "on", description="netio fast paths: `on`, `off` or a comma-separated list (apps/netio/fastpath.py)"
    )

    # Canary by model revision (apps/orchestrator/canary.py): the live rollouts are read this often, and
    # a canary is rolled back when it breaks a bound against its stable revision for `canary_hold_s`.
    canary_refresh_s: float = Field(
        default=5.0, gt=0, description="how often the live rollouts are read and judged"
    )
    canary_ttft_ratio: float = Field(
        default=1.5, gt=1, description="a canary's TTFT p95 may be at most this times the stable revision's"
    )
    canary_tokens_per_s_ratio: float = Field(
        default=0.67,
        gt=0,
        lt=1,
        description="a canary's tokens/s p50 must be at least this times the stable's",
    )
    canary_error_margin: float = Field(
        default=0.02, ge=0, lt=1, description="a canary's failed-attempt ratio may pass the stable's by this"
    )
    canary_window_s: float = Field(default=300.0, gt=0, description="the window a canary is judged over")
    canary_min_requests: int = Field(
        default=20, ge=1, description="requests of each revision in the window before a canary is judged"
    )
    canary_hold_s: float = Field(
        default=60.0, ge=0, description="how long a canary breaks a bound before it is rolled back"
    )

    def canary_bounds(self) -> Bounds:
        return Bounds(
            ttft_ratio=self.canary_ttft_ratio,
            tokens_per_s_ratio=self.canary_tokens_per_s_ratio,
            error_margin=self.canary_error_margin,
            window_s=self.canary_window_s,
            min_requests=self.canary_min_requests,
            hold_s=self.canary_hold_s,
        )

    @property
    def usage_tolerance(self) -> UsageTolerance:
        return UsageTolerance(self.usage_tokens_per_event, self.usage_slack_tokens)

    @property
    def stale_after_s(self) -> float:
        return self.missed_heartbeats * self.heartbeat_interval_s
