"""The dead-node path with a real agent whose link goes silent: a TCP proxy between the agent and a
real orchestrator (in-process, real Redis and PostgreSQL) stops forwarding without closing anything
(no FIN, no RST). The orchestrator must find out from the missed heartbeats alone: it marks the
node dead (heartbeat timeout), ends the in-flight stream with a clean error event and `[DONE]`,
leaves the partial record the sweeper bills, and sends nothing more to the node."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest

from apps.agent.agent import Agent
from apps.agent.deps import AgentDeps
from apps.agent.settings import AgentSettings
from apps.agent.telemetry import NoGpuProbe
from apps.core.ledger.api import ReservationStatus
from apps.core.nodes import keys
from apps.core.protocol.dispatch import DISPATCH_PATH
from apps.orchestrator.app import PLANE, SWEEPER, RunningOrchestrator
from tests.chaos.proxy import TcpProxy
from tests.fakes.engine_sim import MODEL, SimEngine, engine_sim
from tests.fakes.engine_sim import body as engine_body
from tests.fakes.fake_orchestrator import stop_agent
from tests.integration.orchestrator_env import TOKEN, Env, eventually

NODE = "n-silent"


async def _true(value: bool) -> bool:
    return value


@pytest.fixture
async def orch(env: Env) -> RunningOrchestrator:
    # The env's heartbeat interval (0.5 s) is sent to the agent in register_ack: it beats every 0.5 s.
    return await env.orchestrator(
        models=frozenset({MODEL}), orchestrator_id="orch-silent", missed_heartbeats=2, max_request_s=60
    )


@pytest.fixture
async def proxied_agent(
    env: Env, orch: RunningOrchestrator, tmp_path: Path
) -> AsyncIterator[tuple[Agent, TcpProxy, SimEngine]]:
    async with engine_sim() as engine, _agent_behind_proxy(env, orch, tmp_path, engine) as out:
        yield out


@asynccontextmanager
async def _agent_behind_proxy(
    env: Env, orch: RunningOrchestrator, tmp_path: Path, engine: SimEngine
) -> AsyncIterator[tuple[Agent, TcpProxy, SimEngine]]:
    proxy = TcpProxy(orch.port)
    proxy.start()
    settings = AgentSettings(
        orchestrator_url=f"ws://127.0.0.1:{proxy.port}/v1/nodes/connect",
        node_id=NODE,
        node_token=await env.store.issue_token(NODE, "onprem"),
        engine_url=engine.url,
        model=MODEL,
        max_num_seqs=4,
        gpus=1,
        journal=tmp_path / "journal.jsonl",
        drain_ack_wait_s=0.5,
    )
    agent = Agent(settings, AgentDeps(gpu_probe=NoGpuProbe()))
    task = asyncio.create_task(agent.run())
    try:
        async with asyncio.timeout(10):
            await agent.registered.wait()
        yield agent, proxy, engine
    finally:
        proxy.close()  # RST on every connection: the agent's socket ends, it can drain and stop
        await stop_agent(agent, task)


async def test_a_silently_cut_node_is_declared_dead_by_heartbeats_and_its_stream_fails_cleanly(
    env: Env, orch: RunningOrchestrator, proxied_agent: tuple[Agent, TcpProxy, SimEngine]
) -> None:
    _agent, proxy, engine = proxied_agent
    plane = orch.app[PLANE]
    await eventually(lambda: _true(plane.fleet.get(NODE) is not None))
    await env.ledger.add("r-silent", model=MODEL)
    body = {
        "request_id": "r-silent",
        "team_id": 1,
        "key_id": 1,
        "model": MODEL,
        "body": engine_body(endless=True, stream=True),
        "deadlines": {"queue_wait_s": 1.0, "first_token_s": 10.0, "idle_s": 30.0},
    }
    headers = {"Authorization": f"Bearer {TOKEN}"}
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as session:
        async with session.post(orch.url + DISPATCH_PATH, json=body, headers=headers) as resp:
            assert resp.status == 200
            received = await resp.content.readuntil(b"\n\n")
            while received.count(b"data: ") < 3:  # content is flowing through the proxy
                received += await resp.content.readuntil(b"\n\n")
            connections = proxy.live_connections
            proxy.blackhole()
            cut_at = loop.time()
            async with asyncio.timeout(10):  # the idle deadline (30 s) is not what ends it
                rest = await resp.content.read()
            ended_after = loop.time() - cut_at
        stream = received + rest
        assert stream.endswith(b"data: [DONE]\n\n")
        events = [e for e in stream.split(b"\n\n") if e.startswith(b"data: {")]
        error = json.loads(events[-1][len(b"data: ") :])["error"]
        assert error["message"] == "the node serving this request was lost"
        assert error["type"] == "server_error"
        # Found out by the heartbeats (2 x 0.5 s without one), not by a socket close: the proxy
        # closed nothing, and the orchestrator counts a heartbeat timeout.
        assert ended_after >= 0.5
        assert proxy.live_connections == connections
        deaths = plane.metrics.node_deaths.labels(reason="heartbeat_timeout")._value.get()
        assert deaths == 1
        assert plane.metrics.node_deaths.labels(reason="socket_closed")._value.get() == 0
        assert plane.fleet.get(NODE) is None  # out of routing
        # What reached the client is recorded for the sweeper (the node never reported).
        partial = json.loads(await env.redis.get(keys.partial_key("r-silent")) or "null")
        assert partial["completion_tokens"] >= 2
        assert await env.ledger.status("r-silent") is ReservationStatus.RESERVED
        # Nothing more goes to the silent node: a new request waits its queue limit and is refused.
        prefilled = await engine.metric("vllm:prompt_tokens_total")
        await env.ledger.add("r-after", model=MODEL)
        refused = {**body, "request_id": "r-after"}
        async with session.post(orch.url + DISPATCH_PATH, json=refused, headers=headers) as after:
            assert after.status == 503
            assert (await after.json())["error"]["code"] == "queue_timeout"
        assert await engine.metric("vllm:prompt_tokens_total") == prefilled  # no new request
    counts = await orch.app[SWEEPER].sweep_once(datetime.now(UTC) + timedelta(seconds=120))
    assert counts["settled_partial"] == 1
    assert await env.ledger.status("r-silent") is ReservationStatus.SETTLED
    assert await env.ledger.completion_tokens("r-silent") == partial["completion_tokens"]
