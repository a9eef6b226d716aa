"""The node path around one engine under test, in-process: a real orchestrator (real PostgreSQL
`PgLedger`, real Redis `NodeStore`) and a real agent whose engine URL is the engine's.

Used by `test_agent_conformance.py`: the same tests run against enginesim and the real vLLM.
Requests go through the orchestrator's `POST /internal/v1/dispatch` as the gateway sends them,
after a `reserve` in the ledger as the gateway makes it, so settlement lands in a real ledger row.
Engine reads (`/metrics`) are async: the orchestrator and the agent share the test's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from apps.agent.agent import Agent
from apps.agent.settings import AgentSettings
from apps.core.ledger.pg import PgLedger
from apps.core.nodes.store import NodeStore
from apps.core.protocol.dispatch import DISPATCH_PATH, DispatchRequest
from apps.core.sharing import PriorityClass
from apps.core.spec import Prices
from apps.orchestrator.app import RunningOrchestrator
from tests.conformance.conftest import EngineUnderTest
from tests.conformance.helpers import metric
from tests.integration.orchestrator_env import LedgerRow, ledger_row, poll, start_pg_orchestrator

TOKEN = "internal-conformance-token"
SECRET = "server-secret-for-conformance"
NODE_ID = "conf-node-1"
# 1 microcredit per prompt token, 2 per completion token: cost is checkable by hand.
PRICES = Prices(prompt_per_million_microcredits=1_000_000, completion_per_million_microcredits=2_000_000)
CREDITS = 10**12
# The real vLLM's /metrics answers slowly under load: beats every 0.5 s, stale only after 10 missed.
HEARTBEAT_S = 0.5
MISSED_BEATS = 10

Metrics = dict[tuple[str, frozenset[tuple[str, str]]], float]


def sse_payloads(raw: bytes) -> list[str]:
    """Every `data:` payload of an SSE body, in order (`[DONE]` included)."""
    return [line[5:].strip() for line in raw.decode().splitlines() if line.startswith("data:")]


def is_content(payload: str) -> bool:
    """A content chunk (not the role chunk, the usage chunk, an error or `[DONE]`)."""
    return payload.startswith("{") and '"delta":{' in payload and '"role"' not in payload


@dataclass(frozen=True)
class Dispatched:
    status: int
    content_type: str
    payloads: list[str]  # SSE payloads, or the JSON error body as the only element

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return [json.loads(p) for p in self.payloads if p != "[DONE]"]


class AgentFleet:
    def __init__(
        self,
        engine: EngineUnderTest,
        pool: AsyncConnectionPool,
        store: NodeStore,
        ledger: PgLedger,
        orch: RunningOrchestrator,
        agent: Agent,
        session: aiohttp.ClientSession,
        team_id: int,
    ) -> None:
        self.engine = engine
        self.pool = pool
        self.store = store
        self.ledger = ledger
        self.orch = orch
        self.agent = agent
        self.session = session
        self.team_id = team_id

    def body(self, max_tokens: int, *, usage: bool | None = True, **extra: Any) -> dict[str, Any]:
        """A streaming chat body; `usage=None` leaves `stream_options` out altogether."""
        body: dict[str, Any] = {
            "model": self.engine.model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            **extra,
        }
        if usage is not None:
            body["stream_options"] = {"include_usage": usage}
        return body

    async def reserve(self, max_tokens: int, prompt_tokens: int = 64) -> str:
        """A reservation as the gateway makes it (`prompt_tokens`: its prompt estimate, the cost's
        cap with `max_tokens`); returns its request id."""
        request_id = f"conf-{uuid.uuid4().hex[:16]}"
        await self.ledger.reserve(
            request_id=request_id,
            team_id=self.team_id,
            key_id=None,
            model=self.engine.model,
            estimated_prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
        )
        return request_id

    def dispatch_args(
        self,
        request_id: str,
        body: dict[str, Any],
        wants_usage: bool,
        priority_class: PriorityClass = PriorityClass.INTERACTIVE,
        **intent: Any,
    ) -> dict[str, Any]:
        """The gateway's `POST /internal/v1/dispatch` (url, data, headers) for one request; `intent`:
        more `DispatchRequest` fields (the endpoint, the budget)."""
        dreq = DispatchRequest(
            request_id=request_id,
            team_id=self.team_id,
            model=self.engine.model,
            body=body,
            client_wants_usage=wants_usage,
            priority_class=priority_class,
            **intent,
        )
        return {
            "url": self.orch.url + DISPATCH_PATH,
            "data": dreq.model_dump_json(),
            "headers": {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        }

    async def dispatch(
        self, request_id: str, body: dict[str, Any], *, wants_usage: bool, **intent: Any
    ) -> Dispatched:
        args = self.dispatch_args(request_id, body, wants_usage, **intent)
        async with self.session.post(**args) as resp:
            raw = await resp.read()
            ctype = resp.headers.get("Content-Type", "")
        if ctype.startswith("text/event-stream"):
            return Dispatched(resp.status, ctype, sse_payloads(raw))
        return Dispatched(resp.status, ctype, [raw.decode()])

    @contextlib.asynccontextmanager
    async def open_dispatch(
        self, request_id: str, body: dict[str, Any], *, wants_usage: bool
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """The dispatch response, unread; leaving the block closes the connection (a client gone)."""
        resp = await self.session.post(**self.dispatch_args(request_id, body, wants_usage))
        try:
            yield resp
        finally:
            resp.close()

    async def ledger_row(self, request_id: str) -> LedgerRow | None:
        return await ledger_row(self.pool, request_id)

    async def final_row(self, request_id: str, deadline_s: float = 20.0) -> LedgerRow:
        """The row once it left `reserved` (the settle runs after the relay has ended)."""
        row = await poll(
            lambda: self.ledger_row(request_id),
            lambda r: r is not None and r.status != "reserved",
            deadline_s,
        )
        assert row is not None
        return row

    def journaled_done(self, request_id: str) -> dict[str, Any]:
        """The `done` frame the agent journaled (fsynced before sending) for `request_id`."""
        for line in self.agent.journal.path.read_text().splitlines():
            entry = json.loads(line)
            if entry.get("op") == "done" and entry["frame"]["request_id"] == request_id:
                frame: dict[str, Any] = entry["frame"]
                return frame
        raise AssertionError(f"no done journaled for {request_id}")

    async def team_money(self) -> tuple[int, int]:
        """(balance, open reservations) of the test team, in microcredits."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT balance_microcredits, reserved_microcredits FROM teams WHERE id = %s", (self.team_id,)
            )
            row = await cur.fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    async def engine_metrics(self) -> Metrics:
        async with self.session.get(f"{self.engine.url}/metrics") as resp:
            text = await resp.text()
        out: Metrics = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[(sample.name, frozenset(sample.labels.items()))] = sample.value
        return out

    async def engine_running(self) -> float:
        return metric(await self.engine_metrics(), "vllm:num_requests_running")

    async def engine_token_deltas(
        self, before: Metrics, want: tuple[int, int] | None = None, deadline_s: float = 10.0
    ) -> tuple[int, int]:
        """(prompt, generation) token counter deltas since `before`; with `want`, polled until equal
        (the engine's counters may trail the last chunk by a moment)."""

        async def read() -> tuple[int, int]:
            now = await self.engine_metrics()
            return (
                int(metric(now, "vllm:prompt_tokens_total") - metric(before, "vllm:prompt_tokens_total")),
                int(
                    metric(now, "vllm:generation_tokens_total")
                    - metric(before, "vllm:generation_tokens_total")
                ),
            )

        if want is None:
            return await read()
        return await poll(read, lambda d: d == want, deadline_s)

    async def node(self) -> dict[str, object]:
        """This node as `GET /admin/nodes` lists it (registration + live heartbeat hash)."""
        for node in await self.store.list_nodes():
            if node["node_id"] == NODE_ID:
                return node
        raise AssertionError(f"node {NODE_ID} not listed")


def cost(prompt_tokens: int, completion_tokens: int) -> int:
    """What the ledger charges at `PRICES`."""
    return (
        prompt_tokens * PRICES.prompt_per_million_microcredits
        + completion_tokens * PRICES.completion_per_million_microcredits
    ) // 1_000_000


@pytest.fixture
async def fleet(
    engine: EngineUnderTest, migrated_db_url: str, redis_url: str, tmp_path: Path
) -> AsyncIterator[AgentFleet]:
    """The node path around the engine under test (import it into a test module to use it)."""
    async with agent_fleet(engine, migrated_db_url, redis_url, tmp_path) as env:
        yield env


@contextlib.asynccontextmanager
async def agent_fleet(
    engine: EngineUnderTest, db_url: str, redis_url: str, work_dir: Path, **agent_settings: Any
) -> AsyncIterator[AgentFleet]:
    """`agent_settings`: more `AgentSettings` fields (the engine's KV events endpoints...)."""
    pool = AsyncConnectionPool(db_url, min_size=1, max_size=8, open=False)
    await pool.open()
    redis = Redis.from_url(redis_url)
    plane = await start_pg_orchestrator(
        pool,
        redis,
        engine.model,
        PRICES,
        team="conformance",
        credits=CREDITS,
        orchestrator_id=f"orch-conf-{uuid.uuid4().hex[:4]}",
        internal_token=TOKEN,
        secret_key=SECRET,
        heartbeat_interval_s=HEARTBEAT_S,
        missed_heartbeats=MISSED_BEATS,
    )
    store, ledger, orch = plane.store, plane.ledger, plane.orch
    token = await store.issue_token(NODE_ID, "onprem")
    agent = Agent(
        AgentSettings(
            orchestrator_url=orch.ws_url,
            node_id=NODE_ID,
            node_token=token,
            engine_url=engine.url,
            model=engine.model,
            max_num_seqs=8,
            journal=work_dir / "agent-journal.jsonl",
            drain_ack_wait_s=1.0,
            **agent_settings,
        )
    )
    task = asyncio.create_task(agent.run(), name="conformance-agent")
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
    fleet = AgentFleet(engine, pool, store, ledger, orch, agent, session, plane.team_id)
    try:
        async with asyncio.timeout(30):
            # Registered only after the engine's /health was 200 and its /v1/models read.
            registered = asyncio.ensure_future(agent.registered.wait())
            await asyncio.wait({registered, task}, return_when=asyncio.FIRST_COMPLETED)
            registered.cancel()
            assert not task.done(), f"the agent stopped before registering: {task}"
        await poll(fleet.engine_running, lambda n: n == 0, 30.0)  # start from an idle engine
        yield fleet
    finally:
        agent.drain(0.0, reason="test over")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), 15)
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await session.close()
        await orch.close()
        await redis.aclose()
        await pool.close()
