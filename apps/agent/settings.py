"""Settings of the node agent: one typed object, read once by the CLI (env prefix `LLMFLEET_`).

The node token comes only from the environment (`node_token`), never from the command line, so
it does not show up in `ps` or shell history. docs/configuration.md lists the environment names
(generated: tools/gen_config_docs.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMFLEET_", extra="ignore", frozen=True)

    # Comma-separated replicas allowed (a handover or a failed attempt moves on to the next one);
    # in Kubernetes one Service URL.
    orchestrator_url: str = Field(
        description="the orchestrators' node WebSocket, ws://host:port/v1/nodes/connect (comma-separated replicas)"
    )
    node_id: str = Field(
        min_length=1, max_length=128, description="this node's id (a pool member: `<pool>/<name>`)"
    )
    node_token: SecretStr = Field(description="the node's (or its pool's) token: from the environment only")
    engine_url: str = Field("http://127.0.0.1:8000", description="the engine's (vLLM's) HTTP URL")
    model: str = Field(min_length=1, description="the model the engine serves")
    model_revision: str = Field(
        "",
        max_length=128,
        description="the model revision the engine serves (told to the orchestrator; the ledger records it per request)",
    )
    max_num_seqs: int = Field(gt=0, description="the engine's `--max-num-seqs` (the node's slots)")
    max_model_len: int | None = Field(
        default=None, gt=0, description="the engine's context length (unset: read from its /v1/models)"
    )
    gpus: int | None = Field(
        default=None, ge=0, description="GPUs of the node (unset: nvidia-smi's count, else 0)"
    )
    location: Literal["onprem", "cloud"] = Field("onprem", description="where the node runs: onprem or cloud")
    journal: Path = Field(
        Path("llmfleet-agent-journal.jsonl"), description="the journal of unsettled requests"
    )
    health_host: str = Field("127.0.0.1", description="address of the health endpoint")
    health_port: int | None = Field(
        default=None, ge=0, le=65535, description="port of `/livez`, `/readyz`, `/metrics` (unset: none)"
    )
    ca_bundle: Path | None = Field(None, description="CA bundle verifying the orchestrator's TLS certificate")
    kv_events_endpoint: str | None = Field(
        None,
        description="the engine's KV cache events on this node (`ipc://` path or `tcp://127.0.0.1:port`; unset: not forwarded)",
    )
    kv_events_replay_endpoint: str | None = Field(
        None, description="the engine's KV events replay socket (unset: lost batches reset the index)"
    )

    # Timing. Every phase has a bound; defaults follow the design brief.
    heartbeat_interval_s: float = Field(default=5.0, gt=0, description="interval of the heartbeats")
    backoff_base_s: float = Field(default=1.0, gt=0, description="first reconnect backoff")
    backoff_cap_s: float = Field(default=60.0, gt=0, description="longest reconnect backoff")
    register_timeout_s: float = Field(default=10.0, gt=0, description="bound of one registration")
    ws_ping_interval_s: float = Field(default=10.0, gt=0, description="interval of the WebSocket pings")
    send_queue_size: int = Field(default=1024, gt=0, description="frames queued to the orchestrator")
    engine_connect_timeout_s: float = Field(
        default=5.0, gt=0, description="bound of connecting to the engine"
    )
    engine_first_byte_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="longest wait for the engine's first byte (a long prefill under load)",
    )
    engine_idle_timeout_s: float = Field(
        default=60.0, gt=0, description="longest silence between two reads of a stream"
    )
    engine_probe_timeout_s: float = Field(
        default=3.0, gt=0, description="bound of /health, /metrics, /tokenize calls"
    )
    engine_wait_poll_s: float = Field(default=1.0, gt=0, description="poll interval while the engine starts")
    drain_timeout_s: float = Field(
        default=120.0, gt=0, description="bound of the drain on SIGTERM (a `drain` frame brings its own)"
    )
    # Spot reclaim (apps/agent/spot.py): the instance-action URL of the metadata service (None: off;
    # on EC2 http://169.254.169.254/latest/meta-data/spot/instance-action), how often to poll it, and
    # how much of the notice to keep for handing the unfinished streams to other nodes.
    spot_notice_url: str | None = Field(None, description="the spot instance-action URL (unset: not watched)")
    spot_poll_s: float = Field(default=5.0, gt=0, description="how often the spot notice is polled")
    spot_handoff_s: float = Field(
        default=20.0, ge=0, description="part of the spot notice kept for handing streams off"
    )
    drain_ack_wait_s: float = Field(default=5.0, ge=0, description="wait for done_acks before `drained`")
    done_resend_s: float = Field(default=30.0, gt=0, description="resend an unacknowledged `done` after this")
    journal_compact_lines: int = Field(default=1000, gt=0, description="journal lines before it is compacted")
    # Assignments beyond this are refused (503, retryable): the orchestrator should never
    # send that many, so this only guards against a runaway scheduler. None: 4 x max_num_seqs.
    max_in_flight: int | None = Field(
        default=None, gt=0, description="assignments beyond this are refused (unset: 4 x max_num_seqs)"
    )
    dcgm_url: str | None = Field(
        None, description="DCGM exporter /metrics URL (unset: nvidia-smi if on PATH)"
    )
    nvidia_smi: str = Field("nvidia-smi", description="the nvidia-smi command")

    @field_validator("orchestrator_url")
    @classmethod
    def _ws_scheme(cls, value: str) -> str:
        urls = [u.strip() for u in value.split(",") if u.strip()]
        if not urls or not all(u.startswith(("ws://", "wss://")) for u in urls):
            raise ValueError("orchestrator_url must start with ws:// or wss://")
        return value

    @field_validator("engine_url")
    @classmethod
    def _http_scheme(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("engine_url must start with http:// or https://")
        return value.rstrip("/")
