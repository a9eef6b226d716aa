"""A stream resumed on another node after its node failed mid-answer (apps/orchestrator/resume.py):
real Redis and WebSockets, scripted nodes, the dispatch endpoint over HTTP, the in-memory ledger.

Checked: the second node gets the continuation request; the client sees one stream (one role
chunk, one `id`, the text without a gap or a repeat, one usage chunk counting every token it got);
the team is settled once for its prompt and the tokens it received, the re-prefill recorded as
platform cost; the resume metric counts it by reason and outcome; no other node or resume off
gives today's error event and partial settle.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from apps.core.ledger.api import ReservationStatus
from apps.core.protocol import node as proto
from apps.core.protocol.dispatch import DISPATCH_PATH
from apps.core.protocol.engine import engine_body
from apps.core.protocol.openai import sse_event
from apps.core.protocol.vllm import chunk_payload, delta_choice, usage_block
from tests.fakes.fake_node import FakeNode
from tests.integration.orchestrator_env import TOKEN, Env, eventually
from tests.integration.test_orchestrator_app import _done, events

Dispatch = asyncio.Task[tuple[int, dict[str, str], bytes]]

BODY: dict[str, Any] = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
    "max_tokens": 5,
    "stream_options": {"include_usage": True},
}
BUDGET: dict[str, Any] = {"max_prompt_tokens": 100, "max_completion_tokens": 5}  # as the gateway sends it


def role(chunk_id: str, created: int) -> str:
    choice = delta_choice({"role": "assistant", "content": ""})
    return sse_event(chunk_payload(chunk_id, "m", created, [choice])).decode()


def text(chunk_id: str, created: int, content: str, finish: str | None = None) -> str:
    return sse_event(
        chunk_payload(chunk_id, "m", created, [delta_choice({"content": content}, finish)])
    ).decode()


def usage(chunk_id: str, prompt: int, completion: int) -> str:
    return chunk_payload(chunk_id, "m", 2, [], {"usage": usage_block(prompt, completion)}).decode()


async def _continue_on(node: FakeNode, prompt: int) -> proto.Assign:
    """Serve the continuation like vLLM: its own role chunk and id, three tokens, usage."""
    assign = await asyncio.wait_for(node.assigns.get(), 10)
    rid = assign.request_id
    await node.chunk(rid, role("chatcmpl-second", 2) + text("chatcmpl-second", 2, " C"))
    await node.chunk(rid, text("chatcmpl-second", 2, " D"))
    await node.chunk(rid, text("chatcmpl-second", 2, " E", "length"))
    await node.done(rid, prompt, 3, finish_reason="length", usage_event=usage("chatcmpl-second", prompt, 3))
    return assign


async def _start_and_deliver(env: Env, orch: Any, first: FakeNode) -> Dispatch:
    await env.ledger.add("r1")
    task = asyncio.create_task(env.dispatch(orch, "r1", body=BODY, client_wants_usage=True, **BUDGET))
    assign = await asyncio.wait_for(first.assigns.get(), 5)
    await first.chunk(assign.request_id, role("chatcmpl-first", 1) + text("chatcmpl-first", 1, "A"))
    await first.chunk(assign.request_id, text("chatcmpl-first", 1, " B"))
    return task


def _check_client_stream(body: bytes, prompt: int) -> None:
    evs = events(body)
    assert evs[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in evs[:-1]]
    assert not any("error" in c for c in chunks)
    assert {c["id"] for c in chunks} == {"chatcmpl-first"}
    assert {c["created"] for c in chunks} == {1}
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert sum("role" in d for d in deltas) == 1
    assert "".join(d.get("content") or "" for d in deltas) == "A B C D E"
    assert [c for c in chunks if "usage" in c] == [chunks[-1]]
    assert chunks[-1]["usage"] == {
        "prompt_tokens": prompt,
        "total_tokens": prompt + 5,
        "completion_tokens": 5,
    }


def _resumes(orch: Any, reason: str, outcome: str) -> float:
    value = orch.plane.metrics.registry.get_sample_value(
        "llmfleet_orchestrator_resumes_total", {"model": "m", "reason": reason, "outcome": outcome}
    )
    return float(value or 0.0)


async def _two_nodes_first_delivering(env: Env, **orch_kw: Any) -> tuple[Any, FakeNode, FakeNode, Dispatch]:
    """A replica with nodes n1 (on premises: picked first) and n2 (cloud); r1 started on n1, which
    has delivered "A B"."""
    orch = await env.orchestrator(**orch_kw)
    first = await env.node(orch, "n1")
    second = await env.node(orch, "n2", location="cloud")
    return orch, first, second, await _start_and_deliver(env, orch, first)


async def _engine_error(first: FakeNode) -> None:
    """The engine's in-stream error after two tokens; its own count of the prompt is 7."""
    await first.error("r1", 500, "engine died", chunks_sent=2, prompt_tokens=7, completion_tokens=2)


async def _resumed_on(env: Env, task: Dispatch, second: FakeNode) -> tuple[proto.Assign, dict[str, str]]:
    """`second` continues: one stream for the client, settled once for the prompt (7) and all five
    tokens. Returns the continuation's assignment and the response headers."""
    assign = await _continue_on(second, prompt=9)
    status, headers, body = await task
    await _check_resumed(env, status, body, second)
    return assign, headers


async def _check_resumed(env: Env, status: int, body: bytes, second: FakeNode) -> None:
    assert status == 200
    _check_client_stream(body, prompt=7)
    await second.wait_for(lambda: "r1" in second.acks)
    assert env.ledger.settle_calls == [("r1", 7, 5)]


async def _not_resumed(env: Env, task: Dispatch, second: FakeNode, message: str) -> None:
    """The client gets the error event `message`, `second` no continuation, the team the partial
    settle (7 prompt tokens, 2 delivered) once."""
    status, _, body = await asyncio.wait_for(task, 10)
    assert status == 200
    assert json.loads(events(body)[-2])["error"]["message"] == message
    assert second.assigns.empty()
    await eventually(lambda: env.ledger.has("r1", ReservationStatus.SETTLED))
    assert env.ledger.settle_calls == [("r1", 7, 2)]


async def _engine_error_then_resumed_on(
    env: Env,
    relay: Any,
    task: Dispatch,
    first: FakeNode,
    second: FakeNode,
) -> None:
    """`first` fails after its two tokens (its prompt: 7) and `second` continues: one stream for the
    client, settled once for the prompt and all five tokens, counted by `relay`'s resume metric."""
    await _engine_error(first)
    await _resumed_on(env, task, second)
    assert _resumes(relay, "engine_error", "completed") == 1


async def test_engine_error_mid_stream_continues_on_another_node_and_bills_once(env: Env) -> None:
    orch, first, second, task = await _two_nodes_first_delivering(env)
    await _engine_error(first)
    # One settle: the prompt once (the first node's count), every token received; the second
    # node's prefill of prompt + delivered text (9) is platform cost.
    assign, headers = await _resumed_on(env, task, second)
    assert headers["x-llmfleet-node"] == "n1"
    # The continuation request: the delivered text as the assistant message to continue.
    assert assign.request_id == "r1"
    engine = engine_body(assign)  # what the agent sends its engine
    assert engine["messages"] == [*BODY["messages"], {"role": "assistant", "content": "A B"}]
    assert engine["continue_final_message"] is True
    assert engine["add_generation_prompt"] is False
    assert engine["max_tokens"] == 3
    assert await env.ledger.status("r1") is ReservationStatus.SETTLED
    assert env.ledger.resume_prompt_tokens == {"r1": 9}
    assert _resumes(orch, "engine_error", "completed") == 1
    prefill = orch.plane.metrics.registry.get_sample_value(
        "llmfleet_orchestrator_resume_prefill_tokens_total", {"model": "m"}
    )
    assert prefill == 9


async def test_socket_cut_mid_stream_continues_on_another_node(env: Env) -> None:
    # The cut comes once the client has "A B". Frames the orchestrator received but had not yet
    # handled when the socket dropped go with it (it runs with aiohttp's `handler_cancellation`: a
    # lost connection cancels the node socket's handler, whatever aiohttp had buffered), so cutting
    # right after the node *sent* them left the delivered text to timing: on a loaded machine the
    # orchestrator's reader was still on an earlier frame (a heartbeat's Redis write), nothing had
    # reached the client, and the request started over on the second node instead of resuming.
    orch = await env.orchestrator()
    first = await env.node(orch, "n1")
    second = await env.node(orch, "n2", location="cloud")
    await env.ledger.add("r1")
    request = {
        "request_id": "r1", "team_id": 1, "key_id": 1, "model": "m", "body": BODY, "client_wants_usage": True,
    }  # fmt: skip
    headers = {"Authorization": f"Bearer {TOKEN}"}
    received = bytearray()
    has_a_b = asyncio.Event()

    async def client() -> int:
        async with env.session.post(orch.url + DISPATCH_PATH, json=request, headers=headers) as resp:
            while data := await resp.content.readany():
                received.extend(data)
                if b'"content":" B"' in received:
                    has_a_b.set()
            return resp.status

    task = asyncio.create_task(client())
    assign = await asyncio.wait_for(first.assigns.get(), 5)
    await first.chunk(assign.request_id, role("chatcmpl-first", 1) + text("chatcmpl-first", 1, "A"))
    await first.chunk(assign.request_id, text("chatcmpl-first", 1, " B"))
    await asyncio.wait_for(has_a_b.wait(), 10)
    await first.abort()
    # The lost node never said how long the prompt was: 9 prefilled minus the 2 delivered tokens.
    await _continue_on(second, prompt=9)
    status = await asyncio.wait_for(task, 10)
    await _check_resumed(env, status, bytes(received), second)
    assert env.ledger.resume_prompt_tokens == {"r1": 9}
    assert _resumes(orch, "node_lost", "completed") == 1


async def test_no_other_node_gives_the_error_event_and_the_partial_settle_once(env: Env) -> None:
    orch = await env.orchestrator()
    first = await env.node(orch, "n1")
    task = await _start_and_deliver(env, orch, first)
    await first.error("r1", 500, "engine died", chunks_sent=2, prompt_tokens=7, completion_tokens=2)
    status, _, body = await asyncio.wait_for(task, 10)
    evs = events(body)
    assert status == 200
    assert json.loads(evs[-2])["error"]["message"] == "engine died"
    assert evs[-1] == b"[DONE]"
    await eventually(lambda: env.ledger.has("r1", ReservationStatus.SETTLED))
    assert env.ledger.settle_calls == [("r1", 7, 2)]
    assert _resumes(orch, "engine_error", "no_node") == 1


async def test_a_second_failure_ends_the_stream_and_settles_both_parts_once(env: Env) -> None:
    orch, first, second, task = await _two_nodes_first_delivering(env)
    await _engine_error(first)
    assign = await asyncio.wait_for(second.assigns.get(), 10)
    await second.chunk("r1", role("chatcmpl-second", 2) + text("chatcmpl-second", 2, " C"))
    await second.error("r1", 500, "died too", chunks_sent=2, prompt_tokens=9, completion_tokens=1)
    status, _, body = await asyncio.wait_for(task, 10)
    evs = events(body)
    assert engine_body(assign)["max_tokens"] == 3
    assert status == 200
    assert json.loads(evs[-2])["error"]["message"] == "died too"
    contents = [json.loads(e)["choices"][0]["delta"].get("content") for e in evs[:-2]]
    assert "".join(c or "" for c in contents) == "A B C"
    await eventually(lambda: env.ledger.has("r1", ReservationStatus.SETTLED))
    assert env.ledger.settle_calls == [("r1", 7, 3)]  # at most one resume: no third node
    assert env.ledger.resume_prompt_tokens == {"r1": 9}
    assert _resumes(orch, "engine_error", "failed") == 1


async def test_resume_off_for_the_model_keeps_the_error_event(env: Env) -> None:
    _, first, second, task = await _two_nodes_first_delivering(env, resume_models=frozenset({"big"}))
    await _engine_error(first)
    await _not_resumed(env, task, second, "engine died")


async def test_a_stream_handed_off_by_a_drain_resumes_with_reason_drain(env: Env) -> None:
    orch, first, second, task = await _two_nodes_first_delivering(env)
    # The agent's drain budget (a spot notice) ran out with the stream unfinished.
    await first.error(
        "r1",
        503,
        "the node drained",
        error_type="node_draining",
        chunks_sent=3,
        prompt_tokens=7,
        completion_tokens=2,
    )
    await _resumed_on(env, task, second)
    assert _resumes(orch, "drain", "completed") == 1


async def test_a_refusal_mid_stream_is_not_resumed_and_is_settled_once(env: Env) -> None:
    _, first, second, task = await _two_nodes_first_delivering(env)
    await first.error(
        "r1",
        400,
        "bad",
        error_type="invalid_request_error",
        chunks_sent=3,
        prompt_tokens=7,
        completion_tokens=2,
    )
    await _not_resumed(env, task, second, "bad")


async def test_a_relay_on_another_replica_resumes_through_the_owners(env: Env) -> None:
    a = await env.orchestrator()
    b = await env.orchestrator()
    first = await env.node(a, "n1")
    second = await env.node(b, "n2", location="cloud")
    await eventually(
        lambda: _done(b.plane.fleet.get("n1") is not None and a.plane.fleet.get("n2") is not None)
    )
    task = await _start_and_deliver(env, b, first)  # relayed by b, n1 owned by a
    await _engine_error_then_resumed_on(env, b, task, first, second)


async def test_a_node_whose_owner_is_gone_is_skipped_and_the_next_one_continues(env: Env) -> None:
    """kill -9 of a replica takes its nodes with it, but the other replicas' fleet views list them
    until their heartbeats expire: a continuation picked onto one reaches no one (PUBLISH to its
    channel: 0). The resume leaves it out and continues on the next node (it was `no_node`)."""
    a = await env.orchestrator()
    b = await env.orchestrator()
    first = await env.node(a, "n1")
    ghost = await env.node(b, "n-ghost")  # on premises: the picker's first choice
    second = await env.node(a, "n2", location="cloud")
    await eventually(lambda: _done(a.plane.fleet.get("n-ghost") is not None))
    await b.plane.routing.bus.unsubscribe_node("n-ghost")  # as if b died: nobody hears its node's channel
    task = await _start_and_deliver(env, a, first)
    await _engine_error_then_resumed_on(env, a, task, first, second)
    assert ghost.assigns.empty()


async def test_a_replayed_abort_of_the_lost_node_waits_for_the_resume_and_does_not_settle_first(
    env: Env,
) -> None:
    """The lost node's agent aborts when its socket drops, registers again at once and replays that
    `done(abort)` from its journal, while the relay still waits for a node to continue on. Settling
    that report would bill 2 tokens of a 5-token answer (the second node's settle then finds the row
    settled): it is recorded and acknowledged, and the resumed stream is billed whole."""
    orch = await env.orchestrator()
    one_seq = [proto.ModelInfo(name="m", max_num_seqs=1, max_model_len=4096)]
    second = await env.node(orch, "n2", location="cloud", models=one_seq)
    await env.ledger.add("r0")
    busy = asyncio.create_task(env.dispatch(orch, "r0", body=BODY, **BUDGET))  # holds n2's only slot
    assert (await asyncio.wait_for(second.assigns.get(), 5)).request_id == "r0"
    first = await env.node(orch, "n1")
    task = await _start_and_deliver(env, orch, first)
    await eventually(lambda: _done(orch.plane.routing.local["n1"].routes.get("r1") is not None))
    await first.abort()
    again = FakeNode(orch.ws_url, "n1", first.token, heartbeat_every_s=0.2)
    env.nodes.append(again)
    assert isinstance(await again.connect(), proto.RegisterAck)
    await again.done("r1", 7, 2, finish_reason="abort")
    await again.wait_for(lambda: "r1" in again.acks)
    assert await env.ledger.status("r1") is ReservationStatus.RESERVED
    await second.chunk("r0", text("chatcmpl-r0", 1, "x", "stop"))
    await second.done("r0", 1, 1)
    await _continue_on(second, prompt=9)
    status, _, body = await task
    assert status == 200
    _check_client_stream(body, prompt=7)
    await second.wait_for(lambda: "r1" in second.acks)
    assert [c for c in env.ledger.settle_calls if c[0] == "r1"] == [("r1", 7, 5)]
    await busy
