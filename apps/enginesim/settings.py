"""Settings of one simulator instance (env prefix `LLMFLEET_ENGINESIM_`; `llmfleet enginesim` flags win).

docs/configuration.md lists the environment names (generated: tools/gen_config_docs.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from apps.enginesim.faults import Faults


class KvEventsConfig(BaseModel):
    """vLLM's `--kv-events-config` (`vllm/config/kv_events.py`): the same keys and defaults."""

    model_config = ConfigDict(extra="forbid")

    enable_kv_cache_events: bool = False
    publisher: Literal["null", "zmq"] | None = None  # unset: "zmq" when enabled, else "null"
    endpoint: str = "tcp://*:5557"  # bound when `*`, `::`, ipc:// or inproc://; else connected to
    replay_endpoint: str | None = None  # a ROUTER socket (always bound) replaying buffered batches
    buffer_steps: int = Field(10_000, ge=1)  # batches kept for replay
    hwm: int = Field(100_000, ge=0)  # the PUB socket's high-water mark
    max_queue_size: int = Field(100_000, ge=1)  # batches waiting for the publisher thread
    topic: str = ""

    @model_validator(mode="after")
    def _default_publisher(self) -> KvEventsConfig:
        if self.publisher is None:
            self.publisher = "zmq" if self.enable_kv_cache_events else "null"
        return self

    @property
    def publishes(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"


class EngineSimSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMFLEET_ENGINESIM_", extra="forbid")

    model: str = Field("tiny", description="the served model name")
    profile: str | None = Field(
        None, description="the engine profile (unset: the model's when it has one, else tiny)"
    )
    host: str = Field("127.0.0.1", description="address the simulator listens on")
    port: int = Field(8000, description="the simulator's port (0: a free one)")
    speed: float = Field(1.0, description="time factor of the simulated engine (2: twice as fast)")
    seed: int = Field(0, description="random seed")
    max_num_seqs: int | None = Field(None, description="vLLM's `--max-num-seqs` (unset: the profile's)")
    max_model_len: int | None = Field(None, description="vLLM's `--max-model-len` (unset: the profile's)")
    num_blocks: int | None = Field(None, description="KV-cache blocks (unset: the profile's)")
    max_num_batched_tokens: int | None = Field(
        None, description="vLLM's `--max-num-batched-tokens`: the token budget of one step"
    )
    stack: str = Field("prod", description="the stack whose catalog the profiles come from")
    # vLLM's `--scheduling-policy`: `fcfs` (its default) accepts a request `priority` and ignores it.
    scheduling_policy: Literal["fcfs", "priority"] = Field(
        "fcfs", description="vLLM's `--scheduling-policy` (fcfs accepts a priority and ignores it)"
    )
    loading_s: float = Field(0.0, description="simulated model loading time (port bound, refusing)")
    faults: Faults = Field(Faults(), description="injected faults, as JSON (apps/enginesim/faults.py)")
    # Append one JSON line per streamed request (its `user`, arrival and first-content monotonic
    # times) to this file: benchmarks subtract the engine's own TTFT from the client's.
    timing_log: str | None = Field(
        None, description="file getting one JSON line of timings per streamed request"
    )
    # vLLM's `--enable-prefix-caching` (on by default), `--enable-prompt-tokens-details`, and its
    # dev-mode routes (`VLLM_SERVER_DEV_MODE=1`: `/pause`, `/resume`, `/is_paused`).
    enable_prefix_caching: bool = Field(True, description="vLLM's `--enable-prefix-caching`")
    enable_prompt_tokens_details: bool = Field(False, description="vLLM's `--enable-prompt-tokens-details`")
    dev_mode: bool = Field(False, description="vLLM's dev-mode routes (`/pause`, `/resume`, `/is_paused`)")
    # vLLM's `--runner`: a generate engine serves chat and legacy completions, a pooling engine
    # (vLLM: `--runner pooling --convert embed`) serves embeddings of `embedding_dim` values.
    runner: Literal["generate", "pooling"] = Field(
        "generate", description="vLLM's `--runner`: generate (chat, completions) or pooling (embeddings)"
    )
    embedding_dim: int = Field(
        1024, ge=1, description="a pooling engine's embedding length (vLLM: the model's hidden size)"
    )
    kv_events_config: KvEventsConfig = Field(
        KvEventsConfig(), description="vLLM's `--kv-events-config`, as JSON (apps/enginesim/kvevents.py)"
    )
