"""Gateway settings (env prefix `LLMFLEET_`), read once by the CLI and passed to `create_app`."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from apps.core.nodes.keys import NAMESPACE_PATTERN


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMFLEET_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8080
    # A second port serving `/metrics` (then not served on `port`): a NetworkPolicy lets only
    # Prometheus reach it (infra/manifests/netpol.py). None: `/metrics` on `port`.
    metrics_port: int | None = Field(default=None, gt=0, lt=65536)
    # A bearer token every `/metrics` scrape must send ("": none; see apps/core/metrics_access.py).
    metrics_token: str = ""
    database_url: str = "postgresql://postgres@127.0.0.1:5432/postgres"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # The orchestrators' `channel_namespace` (node drains and revocations are published there).
    channel_namespace: str = Field(default="", pattern=NAMESPACE_PATTERN)
    orchestrator_url: str = "http://127.0.0.1:8081"  # comma-separated replicas allowed
    internal_token: str = ""
    secret_key: str = ""
    stack: str = "dev"
    jwks_url: str = ""
    jwt_issuer: str = ""
    jwt_audience: str = ""
    jwt_algorithms: str = "RS256,ES256"
    jwt_team_claim: str = "team"  # a team's name (a string)
    jwt_team_id_claim: str = "team_id"  # a team's id (an integer)
    jwt_class_claim: str = "priority_class"  # "interactive" (also when absent) or "batch"
    jwt_models_claim: str = "models"  # the model allowlist (absent: every model)
    jwt_admin_claim: str = "roles"
    jwt_admin_role: str = "admin"
    jwt_cache_s: int = 300
    # Quotas for JWT (non-key) callers; 0 = unlimited.
    jwt_rpm: int = 600
    jwt_tokens_per_day: int = 0
    jwt_max_streams: int = 50
    max_body_bytes: int = Field(default=1024 * 1024, gt=0)
    key_cache_ttl_s: float = Field(default=4.0, gt=0, le=5.0)
    # The longest a request may run (the same `LLMFLEET_MAX_REQUEST_S` the orchestrator's sweeper
    # settles after). A stream slot's lease is this plus `stream_lease_margin_s`: a crashed
    # gateway's slots free themselves that long after their admission.
    max_request_s: float = Field(default=900.0, gt=0)
    stream_lease_margin_s: float = Field(default=60.0, ge=0)
    queue_wait_s: float = Field(default=30.0, gt=0)
    first_token_s: float = Field(default=60.0, gt=0)
    idle_s: float = Field(default=30.0, gt=0)
    cleanup_timeout_s: float = Field(default=5.0, gt=0)
    refusal_count_timeout_s: float = Field(default=0.25, gt=0)  # the console's 429/503 counter
    # The console's SLO status (admin view): the Prometheus holding the PrometheusRule's recording
    # rules; empty: the view says it is not configured.
    prometheus_url: str = ""
    prometheus_timeout_s: float = Field(default=1.0, gt=0, le=10)
    redis_fail_open: bool = False
    # Per worker process: the autocommit pool (ledger, keys, teams, usage) and a small one for the
    # node admin calls (`NodeStore` groups statements in implicit transactions).
    pg_pool_min: int = Field(default=2, ge=0)
    pg_pool_max: int = Field(default=20, gt=0)
    pg_nodes_pool_max: int = Field(default=2, gt=0)
    redis_max_connections: int = Field(default=200, gt=0)
    # Worker processes sharing the listening socket (`llmfleet gateway --workers N`).
    workers: int = Field(default=1, ge=1, le=64)
    # A worker that exits sooner than this after its start is a start-up failure (no restart).
    worker_startup_s: float = Field(default=10.0, gt=0)
    # On SIGTERM: streams in flight get this long to finish before they are cancelled (and cleaned up).
    graceful_shutdown_s: int = Field(default=30, gt=0)
    # An idle kept-alive client connection is closed after this long. Longer than what clients and
    # proxies in front keep theirs (httpx/the OpenAI SDKs: 5 s; an ALB: its idle timeout, and the
    # rendered Deployment sets this above it), so that the other side closes first: a request sent
    # on a connection the server is closing fails (a reset to the client, a 502 from an ALB).
    keepalive_s: int = Field(default=75, gt=0)
    ssrf_resolve_timeout_s: float = 2.0

    @property
    def stream_lease_s(self) -> float:
        """How long a stream slot outlives its admission without a release (a crashed gateway)."""
        return self.max_request_s + self.stream_lease_margin_s
