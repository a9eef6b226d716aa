"""`LocalPlatform`: the whole llmfleet on one machine, as child processes.

Used by `llmfleet dev` and by the chaos tests. It owns the start order, the readiness
polling (every phase has a deadline and fails fast with the child's log tail) and the
stop in reverse order:

  PostgreSQL + Redis (embedded unless URLs are given) -> migrations -> local JWT issuer
  (JWKS on loopback) -> orchestrators -> engines (enginesim) -> node tokens (NodeStore)
  -> agents -> gateway -> demo team, credits and key -> every node `ready` in the fleet.

Secrets (server key, internal token, issuer key) live in the data directory, mode 0600,
so a restarted `llmfleet dev` on the same directory keeps accepting its earlier keys.
Child processes are started by `apps.cli.procs.Supervisor` (own session, parent-death
signal), so neither Ctrl-C on a terminal nor a killed supervisor leaves servers behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from apps.agent.settings import AgentSettings
from apps.cli.platform_config import (
    DEMO_TEAM,
    MODEL_8B,
    MODEL_32B,
    MODEL_70B,
    MODEL_EMBED,
    Credentials,
    Engine,
    NodeSpec,
    PlatformConfig,
    dev_nodes,
    engine_argv,
    kv_events_args,
)
from apps.cli.procs import Child, ChildFailed, Supervisor, free_port, llmfleet_argv
from apps.cli.settings import DevSettings
from apps.core.db.migrate import migrate_sync
from apps.core.embedded import EmbeddedPostgres, EmbeddedRedis
from apps.core.envnames import env_of
from apps.core.identity.local_issuer import LocalIssuer
from apps.core.secrets import new_secret
from apps.core.sizing.plan import plan_fleet
from apps.core.spec import load_spec
from apps.gateway.settings import GatewaySettings
from apps.orchestrator.settings import OrchestratorSettings


def _load_secrets(path: Path) -> dict[str, str]:
    if path.exists():
        data: dict[str, str] = json.loads(path.read_text())
        return data
    data = {"secret_key": new_secret("sk-srv"), "internal_token": new_secret("it-lf")}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    return data


def _get_json(url: str, token: str, timeout_s: float = 5.0) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})  # noqa: S310 - loopback
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - loopback URL we built
        return json.loads(resp.read())


class LocalPlatform:
    """Start with `start()` (returns the credentials), stop with `stop()`; also a context manager."""

    def __init__(self, config: PlatformConfig) -> None:
        self.config = config
        self.data_dir = config.data_dir.resolve()
        self.supervisor = Supervisor(self.data_dir / "logs")
        self.secrets = _load_secrets(self.data_dir / "secrets.json")
        self.issuer = LocalIssuer.load_or_create(self.data_dir / "issuer.pem")
        self.jwks_url = ""
        self.database_url = config.database_url or ""
        self.redis_url = config.redis_url or ""
        self.orchestrator_ports: list[int] = []
        self.orchestrators: list[Child] = []
        self.engines: dict[str, Engine] = {}  # node id -> the engine it started
        self.node_engines: dict[str, Engine] = {}  # node id -> the engine its agent talks to
        self.agents: dict[str, Child] = {}
        self.agent_health_ports: dict[str, int] = {}
        self.node_tokens: dict[str, str] = {}
        self.agent_urls: dict[str, str] = {}  # node_id -> ws URL override (a chaos proxy)
        self.gateway: Child | None = None
        self.gateway_port = config.gateway_port or free_port()
        self.credentials: Credentials | None = None
        self.demo_team_id: int | None = None  # the demo team's id, once bootstrapped
        self.admin_token = self.issuer.mint("admin", admin=True, ttl_s=7 * 24 * 3600)
        self._pg: EmbeddedPostgres | None = None
        self._redis: EmbeddedRedis | None = None
        stack = load_spec(config.stack)
        plan = plan_fleet(stack)
        self._revisions = {
            name: m.revision for name, m in stack.models.items()
        }  # what each agent says it serves
        self._plan = {name: (m.max_num_seqs, m.gpus_per_replica) for name, m in plan.models.items()}
        # enginesim's runner flags per model: an embedding model's engine runs vLLM's pooling runner.
        self._runner_args = {
            name: ("--runner", "pooling", "--embedding-dim", str(m.embedding_dimensions))
            for name, m in stack.models.items()
            if m.serving.task == "embed"
        }

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> LocalPlatform:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Credentials:
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> Credentials:
        cfg = self.config
        if not self.database_url:
            self._pg = EmbeddedPostgres(self.data_dir / "pg")
            self.database_url = self._pg.start()
        if not self.redis_url:
            self._redis = EmbeddedRedis(self.data_dir / "redis")
            self.redis_url = self._redis.start()
        migrate_sync(self.database_url)
        self.jwks_url = self.issuer.serve()
        self.orchestrator_ports = [free_port() for _ in range(cfg.orchestrators)]
        for index in range(cfg.orchestrators):
            self.start_orchestrator(index)
        for index in range(cfg.orchestrators):
            self.wait_orchestrator(index)
        for spec in cfg.nodes:
            if spec.engine_of is None:
                self.start_engine(spec)
        for spec in cfg.nodes:
            if spec.engine_of is not None:
                base = self.engines[spec.engine_of]
                self.node_engines[spec.node_id] = Engine(spec, base.port, base.child, base.max_num_seqs)
        for engine in self.engines.values():
            self.supervisor.wait_http_ok(engine.child, engine.url + "/health", cfg.ready_timeout_s)
        api_key = asyncio.run(self._bootstrap())
        for spec in cfg.nodes:
            self.start_agent(spec.node_id)
        self.start_gateway()
        self.credentials = Credentials(self.gateway_url + "/v1", api_key, self.admin_token)
        self.wait_nodes_ready([n.node_id for n in cfg.nodes], cfg.ready_timeout_s)
        return self.credentials

    def stop(self) -> None:
        """Reverse order: gateway, agents (drain), engines, orchestrators, issuer, Redis, PostgreSQL."""
        # The gateway and the agents first even when a roll restarted an orchestrator after them (the
        # supervisor stops in reverse start order): an orchestrator stopping while agents still run
        # hands their sockets over, to a replica stopping next, and waits out the handover bound.
        for child in [self.gateway, *self.agents.values()]:
            if child is not None and child in self.supervisor.children:
                self.stop_child(child)
        self.supervisor.stop_all(self.config.stop_timeout_s)
        self.issuer.stop()
        if self._redis is not None:
            self._redis.stop()
            self._redis = None
        if self._pg is not None:
            self._pg.stop()
            self._pg = None

    # -- pieces (also used by the chaos tests) -------------------------------------------------

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    def orchestrator_url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.orchestrator_ports[index]}"

    def orchestrator_ws_url(self, index: int) -> str:
        return f"ws://127.0.0.1:{self.orchestrator_ports[index]}/v1/nodes/connect"

    def _common_env(self, app: type[GatewaySettings | OrchestratorSettings]) -> dict[str, str]:
        secrets = self.secrets
        return env_of(
            app, database_url=self.database_url, redis_url=self.redis_url, stack=self.config.stack,
            secret_key=secrets["secret_key"], internal_token=secrets["internal_token"],
        )  # fmt: skip

    def _gateway_env(self) -> dict[str, str]:
        urls = ",".join(self.orchestrator_url(i) for i in range(len(self.orchestrator_ports)))
        own = env_of(
            GatewaySettings, orchestrator_url=urls, jwks_url=self.jwks_url,
            jwt_issuer=self.issuer.issuer, jwt_audience=self.issuer.audience,
        )  # fmt: skip
        return {**self._common_env(GatewaySettings), **own, **self.config.gateway_env}

    def start_gateway(self) -> Child:
        """(Re)start the gateway on its port and wait for its `/readyz`."""
        workers = self.config.gateway_workers
        extra = () if workers is None else ("--workers", str(workers), "--supervise")
        argv = llmfleet_argv("gateway", "--port", str(self.gateway_port), *extra)
        self.gateway = self.supervisor.start("gateway", argv, self._gateway_env())
        self.supervisor.wait_http_ok(self.gateway, self.gateway_url + "/readyz", self.config.ready_timeout_s)
        return self.gateway

    def start_orchestrator(self, index: int) -> Child:
        name = f"orchestrator-{index}"
        argv = llmfleet_argv(
            "orchestrator", "--port", str(self.orchestrator_ports[index]), "--id", self.orchestrator_id(index)
        )
        child = self.supervisor.start(
            name, argv, {**self._common_env(OrchestratorSettings), **self.config.orchestrator_env}
        )
        if index < len(self.orchestrators):
            self.orchestrators[index] = child
        else:
            self.orchestrators.append(child)
        return child

    def orchestrator_id(self, index: int) -> str:
        return f"{self.config.orchestrator_id_prefix}-{index}"

    def wait_orchestrator(self, index: int) -> None:
        self.supervisor.wait_http_ok(
            self.orchestrators[index], self.orchestrator_url(index) + "/readyz", self.config.ready_timeout_s
        )

    def stop_child(self, child: Child) -> int | None:
        code = self.supervisor.stop(child, self.config.stop_timeout_s)
        if child in self.supervisor.children:
            self.supervisor.children.remove(child)
        return code

    def start_engine(self, spec: NodeSpec) -> Engine:
        seqs = spec.max_num_seqs or self._plan[spec.model][0]
        port = free_port()
        kv = (
            (f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}")
            if self.config.kv_events
            else None
        )
        argv = engine_argv(spec, port, kv) if spec.engine_command else llmfleet_argv(
            "enginesim",
            "--model", spec.model, "--port", str(port), "--speed", str(self.config.speed),
            "--seed", str(self.config.seed), "--max-num-seqs", str(seqs),
            "--scheduling-policy", "priority", "--enable-prompt-tokens-details", *kv_events_args(kv),
            *self._runner_args.get(spec.model, ()), *spec.engine_args,
        )  # fmt: skip
        child = self.supervisor.start(f"engine-{spec.node_id}", argv, dict(spec.engine_env))
        engine = Engine(spec, port, child, seqs, kv)
        self.engines[spec.node_id] = engine
        self.node_engines[spec.node_id] = engine
        return engine

    def start_agent(self, node_id: str, orchestrator_url: str | None = None) -> Child:
        """(Re)start the agent of a node; its journal survives restarts (same file)."""
        engine = self.node_engines[node_id]
        spec = engine.spec
        if orchestrator_url is not None:
            self.agent_urls[node_id] = orchestrator_url
        index = spec.orchestrator
        if index is None:
            index = list(self.node_engines).index(node_id) % len(self.orchestrator_ports)
        # Every replica, its own first: the local stand-in for the Service URL an agent has in
        # Kubernetes (after a handover or a failed attempt the agent moves on to the next one).
        ring = [
            self.orchestrator_ws_url((index + i) % len(self.orchestrator_ports))
            for i in range(len(self.orchestrator_ports))
        ]
        url = self.agent_urls.get(node_id) or ",".join(ring)
        health = free_port()
        self.agent_health_ports[node_id] = health
        argv = llmfleet_argv(
            "agent", "--orchestrator-url", url, "--node-id", node_id, "--engine-url", engine.url,
            "--model", spec.model, "--max-num-seqs", str(engine.max_num_seqs),
            "--model-revision", self._revisions.get(spec.model, ""),
            "--gpus", str(self._plan[spec.model][1]), "--location", spec.location,
            "--journal", str(self.data_dir / "journals" / f"{node_id}.jsonl"), "--health-port", str(health),
        )  # fmt: skip
        if engine.kv_endpoints is not None:
            argv += [
                "--kv-events-endpoint",
                engine.kv_endpoints[0],
                "--kv-events-replay-endpoint",
                engine.kv_endpoints[1],
            ]
        env = {**env_of(AgentSettings, node_token=self.node_tokens[node_id]), **self.config.agent_env}
        (self.data_dir / "journals").mkdir(parents=True, exist_ok=True)
        child = self.supervisor.start(f"agent-{node_id}", argv, env)
        self.agents[node_id] = child
        return child

    def list_nodes(self) -> list[dict[str, Any]]:
        """`GET /admin/nodes` through the gateway, as the admin."""
        data: list[dict[str, Any]] = _get_json(self.gateway_url + "/admin/nodes", self.admin_token)["data"]
        return data

    def wait_nodes_ready(self, node_ids: list[str], timeout_s: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        nodes: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            for node_id in node_ids:
                agent = self.agents.get(node_id)
                if agent is not None and not agent.alive():
                    raise ChildFailed(f"agent of {node_id} exited:\n{agent.log_tail()}")
            try:
                nodes = self.list_nodes()
            except (urllib.error.URLError, OSError, ValueError):
                nodes = []
            ready = {n["node_id"] for n in nodes if n.get("state") == "ready"}
            if set(node_ids) <= ready:
                return nodes
            time.sleep(0.2)
        raise ChildFailed(f"nodes not ready after {timeout_s:.0f} s: {json.dumps(nodes)[:2000]}")

    # -- bootstrap (async stores) --------------------------------------------------------------

    async def _bootstrap(self) -> str:
        """Node tokens for every node and the demo team with credits and a fresh demo key."""
        from psycopg_pool import AsyncConnectionPool
        from redis.asyncio import Redis

        from apps.core.identity.keys import KeyStore
        from apps.core.ledger.teams import Conflict, TeamStore
        from apps.core.nodes.store import NodeStore

        secret = self.secrets["secret_key"].encode()
        redis = Redis.from_url(self.redis_url)
        try:
            async with AsyncConnectionPool(self.database_url, min_size=1, max_size=2, open=False) as pool:
                # Issues tokens only (publishes nothing); the children read the namespace themselves.
                store = NodeStore(pool, redis, secret, channel_namespace=DevSettings().channel_namespace)
                for spec in self.config.nodes:
                    self.node_tokens[spec.node_id] = await store.issue_token(spec.node_id, spec.location)
                teams = TeamStore(pool)
                try:
                    team = await teams.create_team(DEMO_TEAM)
                    await teams.add_credits(
                        team.id, self.config.demo_credits_microcredits, "dev demo credits"
                    )
                except Conflict:
                    team = await teams.get_team(DEMO_TEAM)
                self.demo_team_id = team.id
                key, _ = await KeyStore(pool, secret).create(
                    team=team.id, name="dev demo key", **self.config.demo_key
                )
                return key
        finally:
            await redis.aclose()


__all__ = [
    "DEMO_TEAM",
    "MODEL_8B",
    "MODEL_32B",
    "MODEL_70B",
    "MODEL_EMBED",
    "Credentials",
    "Engine",
    "LocalPlatform",
    "NodeSpec",
    "PlatformConfig",
    "dev_nodes",
]
