"""Settings of the node agent: one typed object, read once by the CLI (env prefix `LLMFLEET_`).

The node token comes only from the environment (`LLMFLEET_NODE_TOKEN`), never from the
command line, so it does not show up in `ps` or shell history.
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
    orchestrator_url: str = Field(description="ws://host:port/v1/nodes/connect (wss:// in production)")
    node_id: str = Field(min_length=1, max_length=128)
    node_token: SecretStr = Field(description="per-node token, from env LLMFLEET_NODE_TOKEN only")
    engine_url: str = "http://127.0.0.1:8000"
    model: str = Field(min_length=1)
    max_num_seqs: int = Field(gt=0)
    max_model_len: int | None = Field(default=None, gt=0)  # None: read from the engine's /v1/models
    gpus: int | None = Field(default=None, ge=0)  # None: count with nvidia-smi, 0 when absent
    location: Literal["onprem", "cloud"] = "onprem"
    journal: Path = Path("llmfleet-agent-journal.jsonl")
    health_host: str = "127.0.0.1"
    health_port: int | None = Field(default=None, ge=0, le=65535)
    ca_bundle: Path | None = None

    # Timing. Every phase has a bound; defaults follow the design brief.
    heartbeat_interval_s: float = Field(default=5.0, gt=0)
    backoff_base_s: float = Field(default=1.0, gt=0)
    backoff_cap_s: float = Field(default=60.0, gt=0)
    register_timeout_s: float = Field(default=10.0, gt=0)
    ws_ping_interval_s: float = Field(default=10.0, gt=0)
    send_queue_size: int = Field(default=1024, gt=0)
    engine_connect_timeout_s: float = Field(default=5.0, gt=0)
    engine_first_byte_timeout_s: float = Field(default=600.0, gt=0)  # prefill of a long prompt under load
    engine_idle_timeout_s: float = Field(default=60.0, gt=0)  # between two reads of one stream
    engine_probe_timeout_s: float = Field(default=3.0, gt=0)  # /health, /metrics, /tokenize
    engine_wait_poll_s: float = Field(default=1.0, gt=0)  # while waiting for the engine to be healthy
    drain_timeout_s: float = Field(
        default=120.0, gt=0
    )  # SIGTERM drain bound (a `drain` frame brings its own)
    # Spot reclaim (apps/agent/spot.py): the instance-action URL of the metadata service (None: off;
    # on EC2 http://169.254.169.254/latest/meta-data/spot/instance-action), how often to poll it, and
    # how much of the notice to keep for handing the unfinished streams to other nodes.
    spot_notice_url: str | None = None
    spot_poll_s: float = Field(default=5.0, gt=0)
    spot_handoff_s: float = Field(default=20.0, ge=0)
    drain_ack_wait_s: float = Field(default=5.0, ge=0)  # wait this long for done_acks before `drained`
    done_resend_s: float = Field(default=30.0, gt=0)  # resend an unacknowledged `done` on a live connection
    journal_compact_lines: int = Field(default=1000, gt=0)
    # Assignments beyond this are refused (503, retryable): the orchestrator should never
    # send that many, so this only guards against a runaway scheduler. None: 4 x max_num_seqs.
    max_in_flight: int | None = Field(default=None, gt=0)
    dcgm_url: str | None = None  # DCGM exporter /metrics URL; else nvidia-smi if on PATH; else no gpu_util
    nvidia_smi: str = "nvidia-smi"

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
