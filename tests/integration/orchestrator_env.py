"""An in-process orchestrator environment for integration tests: real PostgreSQL and Redis,
`NodeStore`, the real ledger behind `settle_usage` (`RecordedLedger`), orchestrator replicas
started on demand, scripted nodes.

The `env` fixture is registered in `tests/integration/conftest.py`.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import aiohttp
import pytest
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from apps.core.ledger.pg import PgLedger
from apps.core.ledger.teams import TeamStore
from apps.core.metering import settle_usage
from apps.core.nodes.store import NodeStore
from apps.core.protocol import node as proto
from apps.core.protocol.dispatch import DISPATCH_PATH
from apps.core.spec import Prices
from apps.orchestrator.app import RunningOrchestrator, start_orchestrator
from apps.orchestrator.plane import OrchestratorDeps
from apps.orchestrator.settings import OrchestratorSettings
from tests.fakes.fake_node import FakeNode
from tests.ids import CHANNEL_NAMESPACE
from tests.integration.recorded_ledger import RecordedLedger

T = TypeVar("T")

TOKEN = "internal-test-token"
SECRET = b"server-secret-for-tests"


class LedgerRow(NamedTuple):
    status: str
    prompt_tokens: int
    completion_tokens: int
    cost_microcredits: int


async def ledger_row(pool: AsyncConnectionPool, request_id: str) -> LedgerRow | None:
    """The request's row in the PostgreSQL ledger (None: never reserved)."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT status::text, prompt_tokens, completion_tokens, cost_microcredits "
            "FROM usage_ledger WHERE request_id = %s",
            (request_id,),
        )
        row = await cur.fetchone()
    return LedgerRow(str(row[0]), int(row[1]), int(row[2]), int(row[3])) if row else None


async def poll(read: Callable[[], Awaitable[T]], ok: Callable[[T], bool], deadline_s: float = 20.0) -> T:
    """Read until `ok(value)` or the deadline (then AssertionError with the last value)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while True:
        value = await read()
        if ok(value):
            return value
        if loop.time() > end:
            raise AssertionError(f"condition not met within {deadline_s} s (last value {value!r})")
        await asyncio.sleep(0.05)  # polling interval with a deadline: these reads have no event


@dataclass
class PgPlane:
    """An orchestrator replica that bills a real `PgLedger` (`start_pg_orchestrator`)."""

    store: NodeStore
    ledger: PgLedger
    team_id: int
    orch: RunningOrchestrator


async def start_pg_orchestrator(
    pool: AsyncConnectionPool,
    redis: Redis,
    model: str,
    prices: Prices,
    *,
    team: str,
    credits: int,
    resume_models: frozenset[str] | None = None,
    **settings: Any,
) -> PgPlane:
    """One replica serving `model`, settling through `settle_usage` on a `PgLedger` like
    production, and a team `team` holding `credits`. `settings`: `OrchestratorSettings` fields
    (`orchestrator_id`, `internal_token`, `secret_key`, `heartbeat_interval_s` at least)."""
    store = NodeStore(
        pool,
        redis,
        str(settings["secret_key"]).encode(),
        channel_namespace=settings.get("channel_namespace", CHANNEL_NAMESPACE),
        heartbeat_interval_s=settings["heartbeat_interval_s"],
    )
    ledger = PgLedger(pool, {model: prices})
    teams = TeamStore(pool)
    created = await teams.create_team(team)
    await teams.add_credits(created.id, credits)
    values: dict[str, Any] = {"fleet_refresh_s": 0.05, "shutdown_grace_s": 2.0, **settings}
    deps = OrchestratorDeps(
        redis=redis,
        node_store=store,
        ledger=ledger,
        settle=functools.partial(settle_usage, ledger, redis),
        models={model},
        resume_models=resume_models,
    )
    orch = await start_orchestrator(OrchestratorSettings(**values), deps)
    return PgPlane(store, ledger, created.id, orch)


class Env:
    def __init__(
        self,
        pool: AsyncConnectionPool,
        redis: Redis,
        ledger: RecordedLedger,
        namespace: str = CHANNEL_NAMESPACE,
    ) -> None:
        """`namespace`: the pub/sub channel namespace of its store and replicas (`tests/ids.py`)."""
        self.pool = pool
        self.redis = redis
        self.namespace = namespace
        self.ledger = ledger
        self.store = NodeStore(pool, redis, SECRET, channel_namespace=namespace, heartbeat_interval_s=0.5)
        self.orchestrators: list[RunningOrchestrator] = []
        self.nodes: list[FakeNode] = []
        self.session = aiohttp.ClientSession()

    async def orchestrator(
        self,
        deps_extra: dict[str, Any] | None = None,
        *,
        resume_models: frozenset[str] | None = None,
        models: frozenset[str] = frozenset({"m", "big"}),
        **overrides: Any,
    ) -> RunningOrchestrator:
        """A replica serving `models` with settings `overrides`; `deps_extra`: more
        `OrchestratorDeps` fields (clocks...)."""
        values: dict[str, Any] = {
            "orchestrator_id": f"orch-{len(self.orchestrators)}-{uuid.uuid4().hex[:4]}",
            "internal_token": TOKEN,
            "secret_key": SECRET.decode(),
            "heartbeat_interval_s": 0.5,
            "fleet_refresh_s": 0.05,
            "shutdown_grace_s": 2.0,
            "channel_namespace": self.namespace,
            **overrides,
        }
        deps = OrchestratorDeps(
            redis=self.redis,
            node_store=self.store,
            ledger=self.ledger,
            settle=functools.partial(settle_usage, self.ledger, self.redis),
            models=set(models),
            **(deps_extra or {}),
            resume_models=resume_models,
        )
        orch = await start_orchestrator(OrchestratorSettings(**values), deps)
        self.orchestrators.append(orch)
        return orch

    async def node(
        self,
        orch: RunningOrchestrator,
        node_id: str,
        *,
        location: str = "onprem",
        connect: bool = True,
        **kw: Any,
    ) -> FakeNode:
        token = await self.store.issue_token(node_id, location)
        kw.setdefault("heartbeat_every_s", 0.2)
        node = FakeNode(orch.ws_url, node_id, token, location=location, **kw)
        self.nodes.append(node)
        if connect:
            ack = await node.connect()
            assert isinstance(ack, proto.RegisterAck), ack
        return node

    async def assigned(
        self,
    ) -> tuple[RunningOrchestrator, FakeNode, asyncio.Task[tuple[int, dict[str, str], bytes]], proto.Assign]:
        """A replica with one node n1, r1 dispatched and assigned to it: (replica, node, the
        dispatch's task, the assignment)."""
        orch = await self.orchestrator()
        node = await self.node(orch, "n1")
        await self.ledger.add("r1")
        task = asyncio.create_task(self.dispatch(orch, "r1"))
        assign = await asyncio.wait_for(node.assigns.get(), 5)
        return orch, node, task, assign

    async def dispatch(
        self, orch: RunningOrchestrator, request_id: str, *, model: str = "m", **kw: Any
    ) -> tuple[int, dict[str, str], bytes]:
        body = {
            "request_id": request_id,
            "team_id": self.ledger.team_id,
            "key_id": None,
            "model": model,
            "body": {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True},
            **kw,
        }
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with self.session.post(orch.url + DISPATCH_PATH, json=body, headers=headers) as resp:
            return resp.status, dict(resp.headers), await resp.read()

    async def close(self) -> None:
        for node in self.nodes:
            await node.close()
        for orch in self.orchestrators:
            await orch.close()
        await self.session.close()


@pytest.fixture
async def env(migrated_db_url: str, redis_url: str) -> AsyncIterator[Env]:
    pool = AsyncConnectionPool(migrated_db_url, min_size=1, max_size=8, open=False)
    await pool.open()
    redis = Redis.from_url(redis_url)
    environment = Env(pool, redis, await RecordedLedger(pool).setup())
    try:
        yield environment
    finally:
        await environment.close()
        await redis.aclose()
        await pool.close()


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """Poll `check` until it holds or the deadline passes (no fixed sleeps)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        if loop.time() > deadline:
            raise AssertionError("condition not met before the deadline")
        await asyncio.sleep(0.02)
