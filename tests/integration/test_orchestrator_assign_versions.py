"""The `assign` each node protocol version gets (real orchestrator, real Redis, scripted nodes over
real WebSockets): a version-4 node gets the client's body and the intent (the agent builds the
engine's body), a version 1-3 node the engine's body built with the same function, and a node
owned by another replica the same as a local one. A version 7 node gets the endpoint of a completion
or an embedding request; an older one never gets such a request (it goes to another node)."""

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


async def _assign(env: Env, version: int, *, remote: bool = False, **intent: object) -> proto.Assign:
    orch = await env.orchestrator()
    owner = await env.orchestrator() if remote else orch
    node = await env.node(owner, "n1", version=version)
    if remote:  # the dispatching replica sees the node in its fleet view first
        await eventually(lambda: _true(orch.plane.fleet.get("n1") is not None))
    task = asyncio.create_task(env.dispatch(orch, "r1", **{**INTENT, **intent}))
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


COMPLETION = {"model": "m", "prompt": "Once upon", "max_tokens": 6}
EMBEDDING = {"model": "m", "input": ["a", "b"]}
QUICK = {"queue_wait_s": 1.0, "first_token_s": 5.0, "idle_s": 5.0}


@pytest.mark.parametrize("remote", [False, True])
async def test_a_version_7_node_gets_the_endpoint(env: Env, remote: bool) -> None:
    assign = await _assign(
        env, 7, remote=remote, body=COMPLETION, endpoint="completions", max_completion_tokens=6, n=1
    )
    assert (assign.endpoint, assign.body) == ("completions", COMPLETION)
    built = engine_body(assign)
    assert (built["prompt"], built["max_tokens"], built["stream"]) == ("Once upon", 6, True)


async def test_a_chat_assignment_names_no_endpoint_on_the_wire(env: Env) -> None:
    assign = await _assign(env, 7)
    assert assign.endpoint is None
    assert "endpoint" not in json.loads(proto.encode(assign))  # a version 1-6 frame stays as it was


async def test_a_node_older_than_version_7_never_gets_an_embedding_request(env: Env) -> None:
    orch = await env.orchestrator()
    old = await env.node(orch, "n-old", version=6)
    intent = {
        "body": EMBEDDING,
        "endpoint": "embeddings",
        "max_prompt_tokens": 40,
        "max_completion_tokens": 0,
    }
    status, _, answer = await env.dispatch(orch, "r1", deadlines=QUICK, **intent)
    assert status == 503, answer  # no node could run it: nothing ran, nothing to settle
    assert old.assigns.empty()
    new = await env.node(orch, "n-new", version=7)
    task = asyncio.create_task(env.dispatch(orch, "r2", **intent))
    try:
        assign = await asyncio.wait_for(new.assigns.get(), 10)
    finally:
        task.cancel()
    assert (assign.request_id, assign.endpoint, assign.body) == ("r2", "embeddings", EMBEDDING)
    assert old.assigns.empty()
    assert "max_tokens" not in engine_body(assign)
    assert "stream" not in engine_body(assign)
