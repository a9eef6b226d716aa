"""Gateway settings (env prefix `LLMFLEET_`), read once by the CLI and passed to `create_app`.

Each field's environment name is `LLMFLEET_` + its name in capitals (apps/core/envnames.py);
docs/configuration.md lists them (generated: tools/gen_config_docs.py).
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from apps.core.nodes.keys import NAMESPACE_PATTERN


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMFLEET_", extra="ignore")

    host: str = Field("127.0.0.1", description="address the gateway listens on (`--host` wins)")
    port: int = Field(8080, description="the gateway's port: the OpenAI API, console, admin (`--port` wins)")
    # A second port serving `/metrics` (then not served on `port`): a NetworkPolicy lets only
    # Prometheus reach it (infra/manifests/netpol.py). None: `/metrics` on `port`.
    metrics_port: int | None = Field(
        default=None, gt=0, lt=65536, description="a second port serving `/metrics` (unset: served on `port`)"
    )
    # A bearer token every `/metrics` scrape must send ("": none; see apps/core/metrics_access.py).
    metrics_token: str = Field("", description="bearer token every `/metrics` scrape must send")
    database_url: str = Field("postgresql://postgres@127.0.0.1:5432/postgres", description="PostgreSQL URL")
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis URL")
    # The orchestrators' `channel_namespace` (node drains and revocations are published there).
    channel_namespace: str = Field(
        default="",
        pattern=NAMESPACE_PATTERN,
        description="prefix of the Redis pub/sub channels (the orchestrators')",
    )
    orchestrator_url: str = Field(
        "http://127.0.0.1:8081", description="the orchestrators' HTTP URL (comma-separated replicas allowed)"
    )
    internal_token: str = Field("", description="bearer sent to the orchestrator's `/internal/*`")
    secret_key: str = Field("", description="server key of the API key hashes (required)")
    stack: str = Field("dev", description="the stack whose spec applies (`stacks/<stack>.yaml`)")
    jwks_url: str = Field("", description="JWKS the JWTs are verified against (empty: no JWT callers)")
    jwt_issuer: str = Field("", description="required JWT issuer")
    jwt_audience: str = Field("", description="required JWT audience")
    jwt_algorithms: str = Field("RS256,ES256", description="JWT algorithm allowlist (comma-separated)")
    jwt_team_claim: str = Field("team", description="claim naming the team (a string)")
    jwt_team_id_claim: str = Field("team_id", description="claim holding the team's id (an integer)")
    jwt_class_claim: str = Field(
        "priority_class", description="claim of the priority class: interactive or batch"
    )
    jwt_models_claim: str = Field("models", description="claim of the model allowlist (absent: every model)")
    jwt_admin_claim: str = Field("roles", description="claim holding the caller's roles")
    jwt_admin_role: str = Field("admin", description="the role in that claim that makes an admin")
    jwt_cache_s: int = Field(300, description="how long the JWKS is cached")
    # Quotas for JWT (non-key) callers; 0 = unlimited.
    jwt_rpm: int = Field(600, description="requests per minute of a JWT caller (0: unlimited)")
    jwt_tokens_per_day: int = Field(0, description="tokens per day of a JWT caller (0: unlimited)")
    jwt_max_streams: int = Field(50, description="concurrent streams of a JWT caller (0: unlimited)")
    max_body_bytes: int = Field(default=1024 * 1024, gt=0, description="largest request body")
    key_cache_ttl_s: float = Field(
        default=4.0, gt=0, le=5.0, description="how long an API key lookup is cached"
    )
    # The longest a request may run (the same `max_request_s` the orchestrator's sweeper
    # settles after). A stream slot's lease is this plus `stream_lease_margin_s`: a crashed
    # gateway's slots free themselves that long after their admission.
    max_request_s: float = Field(
        default=900.0, gt=0, description="longest a request may run (the same value as the orchestrator's)"
    )
    stream_lease_margin_s: float = Field(
        default=60.0,
        ge=0,
        description="a stream slot's lease beyond `max_request_s` (a crashed gateway's slots)",
    )
    queue_wait_s: float = Field(default=30.0, gt=0, description="longest wait for a node")
    first_token_s: float = Field(default=60.0, gt=0, description="longest wait for the first token")
    idle_s: float = Field(default=30.0, gt=0, description="longest silence between two chunks of a stream")
    cleanup_timeout_s: float = Field(default=5.0, gt=0, description="bound of a request's clean-up")
    refusal_count_timeout_s: float = Field(
        default=0.25, gt=0, description="bound of counting a 429/503 for the console"
    )
    guardrail_count_timeout_s: float = Field(
        default=0.25, gt=0, description="bound of counting a request's guardrail decisions for the console"
    )
    # The console's SLO status (admin view): the Prometheus holding the PrometheusRule's recording
    # rules; empty: the view says it is not configured.
    prometheus_url: str = Field(
        "", description="Prometheus the console's SLO status reads (empty: not shown)"
    )
    prometheus_timeout_s: float = Field(default=1.0, gt=0, le=10, description="bound of one Prometheus query")
    redis_fail_open: bool = Field(
        False, description="admit without quotas when Redis fails (default: refuse)"
    )
    # Per worker process: the autocommit pool (ledger, keys, teams, usage) and a small one for the
    # node admin calls (`NodeStore` groups statements in implicit transactions).
    pg_pool_min: int = Field(default=2, ge=0, description="PostgreSQL pool minimum, per worker process")
    pg_pool_max: int = Field(default=20, gt=0, description="PostgreSQL pool size, per worker process")
    pg_nodes_pool_max: int = Field(default=2, gt=0, description="PostgreSQL pool of the node admin calls")
    redis_max_connections: int = Field(default=200, gt=0, description="Redis connection pool size")
    # Worker processes sharing the listening socket (`llmfleet gateway --workers N`).
    workers: int = Field(
        default=1, ge=1, le=64, description="worker processes sharing the socket (`--workers` wins)"
    )
    # A worker that exits sooner than this after its start is a start-up failure (no restart).
    worker_startup_s: float = Field(
        default=10.0, gt=0, description="a worker exiting sooner than this after its start is not restarted"
    )
    # On SIGTERM: streams in flight get this long to finish before they are cancelled (and cleaned up).
    graceful_shutdown_s: int = Field(
        default=30, gt=0, description="on SIGTERM, how long streams in flight get to finish"
    )
    # An idle kept-alive client connection is closed after this long. Longer than what clients and
    # proxies in front keep theirs (httpx/the OpenAI SDKs: 5 s; an ALB: its idle timeout, and the
    # rendered Deployment sets this above it), so that the other side closes first: a request sent
    # on a connection the server is closing fails (a reset to the client, a 502 from an ALB).
    keepalive_s: int = Field(
        default=75, gt=0, description="idle keep-alive connections are closed after this (above the proxy's)"
    )
    ssrf_resolve_timeout_s: float = Field(
        2.0, description="bound of resolving a URL in a request (SSRF check)"
    )
    # apps/netio/fastpath.py: `on`, `off` or a comma-separated list of the fast paths to keep on.
    netio_fastpaths: str = Field(
        "on", description="netio fast paths: `on`, `off` or a comma-separated list (apps/netio/fastpath.py)"
    )

    @property
    def stream_lease_s(self) -> float:
        """How long a stream slot outlives its admission without a release (a crashed gateway)."""
        return self.max_request_s + self.stream_lease_margin_s
