"""The platform behind a gateway, in-process, for the gateway's tests: a real orchestrator replica
(`apps.orchestrator`), a real node agent (`apps.agent`) and enginesim (`apps.enginesim`) serving
the dev stack's 8B model, billing the gateway's ledger through `settle_usage` as production does.

No part is a fake: what the gateway's tests shape is the engine, through the interfaces vLLM has
too (`ignore_eos` and `max_tokens` for the length of an answer, the engine's speed, the dev-mode
`/pause` and `/resume` to hold requests, enginesim's `/_sim/faults` for a broken engine).
`RecordingDispatcher` wraps the real `HttpDispatcher` to record what the gateway asked of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from apps.agent.agent import Agent
from apps.agent.deps import AgentDeps
from apps.agent.settings import AgentSettings
from apps.agent.telemetry import NoGpuProbe
from apps.core.ledger.api import Ledger, SettleResult
from apps.core.metering import settle_usage
from apps.core.nodes.store import NodeStore
from apps.core.protocol.dispatch import DispatchRequest
from apps.core.rollouts import RolloutStore
from apps.core.spec import load_spec
from apps.enginesim.faults import Faults
from apps.gateway.dispatcher import HttpDispatcher
from apps.gateway.ports import Upstream
from apps.orchestrator.app import RunningOrchestrator, start_orchestrator
from apps.orchestrator.plane import OrchestratorDeps
from apps.orchestrator.settings import OrchestratorSettings
from tests.fakes.engine_sim import SimEngine, engine_sim
from tests.fakes.fake_orchestrator import stop_agent

MODEL = "llama-3.1-8b-instruct"
# The dev stack's embedding model (`serving.task: embed`) and the length of its vectors.
EMBED_MODEL, EMBED_DIMS = next(
    (name, m.embedding_dimensions or 0)
    for name, m in load_spec("dev").models.items()
    if m.serving.task == "embed"
)
REVISION = "8b-rev-test"  # what the node's agent says its engine serves (the ledger records it)
SLOTS = 512  # the node's slots: the gateway's own limits, not the node, bound what its tests run


@dataclass(frozen=True)
class FleetSetup:
    """The platform behind the gateway. `speed`: enginesim's time factor (1: the tiny profile's pace,
    about a millisecond a token; 0.001 makes an answer of a few hundred tokens outlast any test).
    `nodes=0`: no node serves the model, so the orchestrator answers 503 `model_unavailable` at once.
    `slots`: the node's (and its engine's) `max_num_seqs`. `faults`: the engine's, from the start.
    `orchestrator`: `OrchestratorSettings` overrides (its queue bounds...)."""

    speed: float = 50.0
    nodes: int = 1
    slots: int = SLOTS
    faults: Faults | None = None
    max_model_len: int = 16384
    orchestrator: Mapping[str, Any] = field(default_factory=dict)
    # One node per revision (a canary's test: issue 30); the replica reads the live rollouts from the
    # ledger's PostgreSQL. Empty: `nodes` nodes of `REVISION`.
    revisions: tuple[str, ...] = ()
    # The engine's seed per revision (enginesim's answers follow it: another seed answers as other
    # weights would). Absent: 0.
    seeds: Mapping[str, int] = field(default_factory=dict)
    # A second node serving the dev stack's embedding model (enginesim's pooling runner, issue 31).
    embed: bool = False


@dataclass
class Fleet:
    orchestrator: RunningOrchestrator
    engine: SimEngine | None
    internal_token: str
    node_id: str | None = None  # the node's id in the node store (None: no node)
    engines: dict[str, SimEngine] = field(default_factory=dict)  # by revision, with `revisions`

    @property
    def url(self) -> str:
        return self.orchestrator.url

    def set_faults(self, faults: Faults) -> None:
        assert self.engine is not None, "a fleet without a node has no engine"
        self.engine.set_faults(faults)

    async def pause(self) -> None:
        """Hold every request at the engine (running or arriving) until `resume()`."""
        assert self.engine is not None
        await self.engine.pause()

    async def resume(self) -> None:
        assert self.engine is not None
        await self.engine.resume()

    async def prompt_tokens(self, messages: list[dict[str, str]]) -> int:
        """The engine's count of a chat prompt: what a settle bills."""
        assert self.engine is not None
        return await self.engine.prompt_tokens(messages)


@contextlib.asynccontextmanager
async def running_fleet(
    redis: Redis,
    store: NodeStore,
    ledger: Ledger,
    secret_key: str,
    channel_namespace: str,
    tmp_dir: Path,
    setup: FleetSetup = FleetSetup(),
    clock: Callable[[], datetime] | None = None,
    rollouts: RolloutStore | None = None,
) -> AsyncIterator[Fleet]:
    """`clock`: the moment a settle counts its tokens at (None: the wall clock); the gateway's tests
    give the gateway's, so a test that pins it pins the UTC day admission and settle count on.
    `rollouts`: the live rollouts of canary revisions the replica reads (with `setup.revisions`)."""
    token = f"it-{uuid.uuid4().hex}"
    settings = OrchestratorSettings(
        orchestrator_id=f"orch-gw-{uuid.uuid4().hex[:6]}",
        internal_token=token,
        secret_key=secret_key,
        channel_namespace=channel_namespace,
        heartbeat_interval_s=0.5,
        fleet_refresh_s=0.05,
        shutdown_grace_s=2.0,
        cold_start_grace_s=0.0 if setup.nodes == 0 else 30.0,
        max_request_s=120.0,
        **setup.orchestrator,
    )
    deps = OrchestratorDeps(
        redis=redis,
        node_store=store,
        ledger=ledger,
        settle=functools.partial(_settle, ledger, redis, clock),
        models={MODEL, EMBED_MODEL} if setup.embed else {MODEL},
        rollouts=rollouts,
    )
    orch = await start_orchestrator(settings, deps)
    try:
        if setup.nodes == 0:
            yield Fleet(orch, None, token)
            return
        assert setup.nodes == 1 or setup.revisions, "one node: the gateway's tests need no more"
        async with contextlib.AsyncExitStack() as stack:
            engines: dict[str, SimEngine] = {}
            node_id = None
            for revision in setup.revisions or (REVISION,):
                engine = await stack.enter_async_context(_engine(setup, setup.seeds.get(revision, 0)))
                agent = await stack.enter_async_context(
                    _agent(orch, store, engine, tmp_dir, setup.slots, revision)
                )
                engines[revision], node_id = engine, node_id or agent.settings.node_id
            if setup.embed:
                embedder = await stack.enter_async_context(_embed_engine(setup))
                await stack.enter_async_context(
                    _agent(orch, store, embedder, tmp_dir, setup.slots, REVISION, EMBED_MODEL)
                )
                engines[EMBED_MODEL] = embedder
            yield Fleet(orch, next(iter(engines.values())), token, node_id, engines)
    finally:
        await orch.close()


def _engine(setup: FleetSetup, seed: int = 0) -> contextlib.AbstractAsyncContextManager[SimEngine]:
    return engine_sim(
        setup.speed,
        model=MODEL,
        seed=seed,
        dev_mode=True,
        # As the platform starts vLLM: classes reach the engine, cached input is reported.
        scheduling_policy="priority",
        enable_prompt_tokens_details=True,
        max_num_seqs=setup.slots,
        max_model_len=setup.max_model_len,
        num_blocks=max(4096, setup.max_model_len // 16 + 1),
        faults=setup.faults or Faults(),
    )


def _embed_engine(setup: FleetSetup) -> contextlib.AbstractAsyncContextManager[SimEngine]:
    return engine_sim(
        setup.speed,
        model=EMBED_MODEL,
        runner="pooling",
        embedding_dim=EMBED_DIMS,
        scheduling_policy="priority",
        max_num_seqs=setup.slots,
        max_model_len=setup.max_model_len,
        faults=setup.faults or Faults(),
    )


async def _settle(
    ledger: Ledger, redis: Redis, clock: Callable[[], datetime] | None, *args: Any, **kwargs: Any
) -> SettleResult:
    return await settle_usage(ledger, redis, *args, now=clock() if clock else None, **kwargs)


@contextlib.asynccontextmanager
async def _agent(
    orch: RunningOrchestrator,
    store: NodeStore,
    engine: SimEngine,
    tmp_dir: Path,
    slots: int,
    revision: str,
    model: str = MODEL,
) -> AsyncIterator[Agent]:
    node_id = f"gw-node-{uuid.uuid4().hex[:6]}"
    settings = AgentSettings(
        orchestrator_url=orch.ws_url,
        node_id=node_id,
        node_token=await store.issue_token(node_id, "onprem"),
        engine_url=engine.url,
        model=model,
        model_revision=revision,
        max_num_seqs=slots,
        gpus=1,
        journal=tmp_dir / f"{node_id}.jsonl",
        drain_ack_wait_s=0.5,
    )
    agent = Agent(settings, AgentDeps(gpu_probe=NoGpuProbe()))
    task = asyncio.create_task(agent.run())
    try:
        async with asyncio.timeout(20):
            await agent.registered.wait()
        yield agent
    finally:
        await stop_agent(agent, task)


@dataclass
class _Watched:
    """One upstream the gateway opened, counted while open."""

    owner: RecordingDispatcher
    inner: Upstream
    closed: bool = False

    @property
    def status(self) -> int:
        return self.inner.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self.inner.headers

    def chunks(self) -> AsyncIterator[bytes]:
        return self.inner.chunks()

    async def read_body(self) -> bytes:
        return await self.inner.read_body()

    def __getattr__(self, name: str) -> Any:
        # The relay's fast-path capabilities (`take_buffered`, `set_sink`), probed with getattr: the
        # recorded upstream takes the same path as an unrecorded one.
        return getattr(self.inner, name)

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            self.owner.open_now -= 1
            self.owner.closed += 1
        await self.inner.aclose()


@dataclass
class RecordingDispatcher:
    """The real dispatcher, recording what the gateway asked: every `DispatchRequest` sent, the
    upstreams open now and at most at once, how many the gateway closed, and each answer's headers."""

    inner: HttpDispatcher
    requests: list[DispatchRequest] = field(default_factory=list)
    answers: list[Mapping[str, str]] = field(default_factory=list)
    open_now: int = 0
    max_open: int = 0
    closed: int = 0

    async def open(self, request: DispatchRequest) -> Upstream:
        self.requests.append(request)
        upstream = await self.inner.open(request)
        self.answers.append(upstream.headers)
        self.open_now += 1
        self.max_open = max(self.max_open, self.open_now)
        return _Watched(self, upstream)

    async def aclose(self) -> None:
        await self.inner.aclose()
