"""The `assign` each node protocol version gets (real orchestrator, real Redis, scripted nodes over
real WebSockets): a version-4 node gets the client's body and the intent (the agent builds the
engine's body), a version 1-3 node the engine's body built with the same function, and a node
owned by another replica the same as a local one."""

from __future__ import annotations

import asyncio
import json

import pytest

from apps.core.budget import Budget
from apps.core.protocol import node as proto
from apps.core.protocol.engine import engine_body
from apps.core.scheduling.prefix import team_scope
from apps.core.sharing import PriorityClass
from tests.integration.orchestrator_env import Env, eventually

pytestmark = pytest.mark.timeout(60)

CLIENT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2}
INTENT = {
    "body": CLIENT,
    "max_prompt_tokens": 40,
    "max_completion_tokens": 12,
    "n": 2,
    "priority_class": "batch",
    "client_wants_usage": True,
    "client_wants_chunk_usage": True,
}


async def _true(value: bool) -> bool:
    return value


async def _assign(env: Env, version: int, *, remote: bool = False) -> proto.Assign:
    orch = await env.orchestrator()
    owner = await env.orchestrator() if remote else orch
    node = await env.node(owner, "n1", version=version)
    if remote:  # the dispatching replica sees the node in its fleet view first
        await eventually(lambda: _true(orch.plane.fleet.get("n1") is not None))
    task = asyncio.create_task(env.dispatch(orch, "r1", **INTENT))
    try:
        return await asyncio.wait_for(node.assigns.get(), 10)
    finally:
        task.cancel()


@pytest.mark.parametrize("remote", [False, True])
async def test_a_version_4_node_gets_the_intent(env: Env, remote: bool) -> None:
    assign = await _assign(env, 4, remote=remote)
    scope = team_scope(env.ledger.team_id)
    # The team's cache scope in the body (a version 4 node knows no `cache_scope`; its engine body keeps it).
    assert assign.body == {**CLIENT, "cache_salt": scope}
    assert assign.cache_scope is None
    assert "cache_scope" not in json.loads(proto.encode(assign))
    assert assign.budget == Budget(40, 12, 2)
    assert (assign.priority_class, assign.wants_chunk_usage) == (PriorityClass.BATCH, True)
    built = engine_body(assign)
    assert (built["max_tokens"], built["n"], built["priority"], built["cache_salt"]) == (6, 2, 10, scope)


@pytest.mark.parametrize("remote", [False, True])
async def test_a_version_5_node_gets_the_teams_cache_scope(env: Env, remote: bool) -> None:
    assign = await _assign(env, 5, remote=remote)
    assert assign.body == CLIENT  # the client's body as the gateway forwarded it
    assert assign.cache_scope == team_scope(env.ledger.team_id)
    assert engine_body(assign)["cache_salt"] == assign.cache_scope


@pytest.mark.parametrize("remote", [False, True])
async def test_an_older_node_gets_the_engine_body(env: Env, remote: bool) -> None:
    assign = await _assign(env, 3, remote=remote)
    raw = json.loads(proto.encode(assign))
    assert set(raw) == {"type", "request_id", "model", "body"}
    assert assign.body["max_tokens"] == 6
    assert assign.body["priority"] == 10
    assert assign.body["cache_salt"] == team_scope(env.ledger.team_id)
    assert assign.body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
