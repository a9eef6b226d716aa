"""The node agent against the engine under test (enginesim, and the real vLLM in the `realvllm` stage).

A real orchestrator and a real agent (in-process, `agent_env.py`) with the agent's engine URL on the
engine under test; requests go through `POST /internal/v1/dispatch` after a ledger reservation, as
the gateway sends them. Checked: chunks relayed and usage settled equal to the engine's own token
counters; usage forced on by the agent and stripped for a client that did not ask; cancel
mid-stream aborts inside the engine and settles what ran; heartbeats carry the engine's queue and
KV-cache readings (no GPU reading is made up); an engine 400 reaches the client as an OpenAI error
and the reservation is cancelled. Engine differences come only from `differences.py`.
"""

from __future__ import annotations

import asyncio
import json
import shutil

from tests.conformance.agent_env import AgentFleet, cost, fleet, is_content, poll
from tests.conformance.helpers import metric
from tests.conformance.slots import paused_engine

LONG = 1000  # with the 8-token prompt, fits max-model-len 1024
QUEUED = 3
HELD_ANSWER = 1500  # long: the released requests are most likely still running when frozen
__all__ = ["fleet"]  # the fixture, imported from agent_env


async def test_stream_relays_engine_chunks_and_settles_engine_usage(fleet: AgentFleet) -> None:
    engine, max_tokens = fleet.engine, 24
    before = await fleet.engine_metrics()
    balance_before, _ = await fleet.team_money()
    request_id = await fleet.reserve(max_tokens)

    res = await fleet.dispatch(request_id, fleet.body(max_tokens), wants_usage=True)

    assert res.status == 200, res.payloads
    assert res.content_type.startswith("text/event-stream")
    assert res.payloads[-1] == "[DONE]"
    assert res.payloads.count("[DONE]") == 1
    chunks = res.chunks
    role, content, usage_chunk = chunks[0], chunks[1:-1], chunks[-1]
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert {c["id"] for c in chunks} == {role["id"]}
    assert role["id"].startswith("chatcmpl-")
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert {c["model"] for c in chunks} == {engine.model}
    assert all("usage" not in c and "content" in c["choices"][0]["delta"] for c in content)
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    if engine.traits.one_chunk_per_token:
        assert len(content) == max_tokens
    else:
        assert 1 <= len(content) <= max_tokens
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    assert usage["completion_tokens"] == max_tokens  # ignore_eos
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert res.payloads[-2] == fleet.journaled_done(request_id)["usage_event"]  # the engine's bytes

    row = await fleet.final_row(request_id)
    assert row.status == "settled"
    assert (row.prompt_tokens, row.completion_tokens) == (usage["prompt_tokens"], usage["completion_tokens"])
    assert row.cost_microcredits == cost(row.prompt_tokens, row.completion_tokens)
    assert await fleet.team_money() == (balance_before - row.cost_microcredits, 0)
    # The engine's own counters saw exactly what the ledger billed.
    await fleet.engine_token_deltas(before, want=(row.prompt_tokens, row.completion_tokens))


async def test_usage_forced_on_but_not_sent_to_a_client_that_did_not_ask(fleet: AgentFleet) -> None:
    # The dispatch contract (apps/core/protocol/dispatch.py): the usage chunk only if
    # `client_wants_usage`. The body has no `stream_options` at all, so the engine sends usage
    # only because the agent forced `include_usage` on (apps/agent/relay.py).
    max_tokens = 16
    before = await fleet.engine_metrics()
    request_id = await fleet.reserve(max_tokens)
    body = fleet.body(max_tokens, usage=None)
    assert "stream_options" not in body

    res = await fleet.dispatch(request_id, body, wants_usage=False)

    assert res.status == 200, res.payloads
    assert res.payloads[-1] == "[DONE]"
    assert all("usage" not in c for c in res.chunks)
    assert all(c["choices"] for c in res.chunks)
    assert res.chunks[-1]["choices"][0]["finish_reason"] == "length"
    row = await fleet.final_row(request_id)
    assert row.status == "settled"
    assert row.completion_tokens == max_tokens
    await fleet.engine_token_deltas(before, want=(row.prompt_tokens, row.completion_tokens))
    # Billed from the engine's usage chunk (kept in the agent's done), not from counting chunks.
    done = fleet.journaled_done(request_id)
    assert done["usage_event"] is not None
    usage = json.loads(done["usage_event"])["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (row.prompt_tokens, row.completion_tokens)


async def test_cancel_mid_stream_aborts_in_the_engine_and_settles_what_ran(fleet: AgentFleet) -> None:
    engine = fleet.engine
    before = await fleet.engine_metrics()
    request_id = await fleet.reserve(LONG)
    seen = 0
    async with fleet.open_dispatch(request_id, fleet.body(LONG), wants_usage=True) as resp:
        assert resp.status == 200
        async with asyncio.timeout(60):
            async for line in resp.content:
                text = line.decode()
                if text.startswith("data:") and is_content(text[5:].strip()):
                    seen += 1
                    if seen == 3:
                        break  # leaving the block closes the connection: the client is gone
    assert seen == 3

    await poll(fleet.engine_running, lambda n: n == 0, 10.0)
    row = await fleet.final_row(request_id)
    assert row.status == "settled"  # not left `reserved`, not cancelled: tokens were produced
    assert seen <= row.completion_tokens <= LONG  # at least what the client received
    assert row.cost_microcredits == cost(row.prompt_tokens, row.completion_tokens)
    assert (await fleet.team_money())[1] == 0
    # Prompt tokens after an abort come from the engine's /tokenize: exactly what it prefilled.
    _, generated = await poll(
        lambda: fleet.engine_token_deltas(before), lambda d: d[0] == row.prompt_tokens, 10.0
    )
    # Never billed beyond what the engine generated (it may run a few tokens past the last relayed chunk).
    assert row.completion_tokens <= generated
    if engine.traits.abort_always_beats_completion:
        assert generated < LONG
        assert row.completion_tokens < LONG
        done = fleet.journaled_done(request_id)
        assert (done["finish_reason"], done["usage_event"]) == ("abort", None)


async def test_heartbeats_carry_the_engine_queue_and_kv_use(fleet: AgentFleet) -> None:
    """The engine's waiting queue and KV use reach the orchestrator in the node's heartbeats.

    Certain on a machine of any speed (`slots.py`): requests are queued in a paused engine, so its
    own snapshot says exactly `QUEUED` waiting for as long as the check needs, and the beats must
    come to say the same. Then they are released and the engine frozen again at once ("keep",
    cache kept): whatever its snapshot says then (requests running with KV blocks, or already
    done), it holds still, and the beats must come to carry exactly its queue and KV use."""
    engine = fleet.engine
    node = await poll(
        fleet.node, lambda n: n["state"] == "ready" and n["last_heartbeat_age_s"] is not None, 10.0
    )
    assert node["models"] == [engine.model]
    async with paused_engine(engine.url, engine.model) as eng:
        queued = [eng.chat(f"q{i}", "hello " * 300, 0, HELD_ANSWER) for i in range(QUEUED)]
        for outcome in queued:
            await eng.queued(outcome)
        waiting = await poll(fleet.node, lambda n: n["queue_depth"] == QUEUED, 30.0)
        await eng.release()
        await eng.freeze()
        kv = metric(await fleet.engine_metrics(), "vllm:kv_cache_usage_perc")
        held = await eng.state()
        loaded = await poll(
            fleet.node, lambda n: (n["queue_depth"], n["kv_cache_usage"]) == (held.waiting, kv), 30.0
        )
        print(f"\n{engine.kind}: frozen with {held.running} running, KV use {kv}")
    for sample in (waiting, loaded):
        assert isinstance(sample["kv_cache_usage"], float)
        assert 0.0 <= sample["kv_cache_usage"] <= 1.0
        if shutil.which("nvidia-smi") is None:  # a CPU machine: no GPU reading, and none made up
            assert sample["gpu_util"] is None
    # Back to idle: the heartbeats follow the engine's gauges down.
    await poll(fleet.node, lambda n: n["queue_depth"] == 0 and n["kv_cache_usage"] == 0.0, 20.0)


async def test_engine_400_reaches_the_client_and_cancels_the_reservation(fleet: AgentFleet) -> None:
    engine = fleet.engine
    before = await fleet.engine_metrics()
    balance_before, _ = await fleet.team_money()
    request_id = await fleet.reserve(5000)

    res = await fleet.dispatch(request_id, fleet.body(5000), wants_usage=True)

    # Engine refused the body before any output: its status with `param`, nothing retried
    # (apps/core/protocol/dispatch.py; docs/agent.md "engine answer" table: 400 -> 400 invalid_request_error).
    assert res.status == 400, res.payloads
    assert res.content_type.startswith("application/json")
    body = json.loads(res.payloads[0])
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["param"] == "max_tokens"
    assert f"max_model_len={engine.max_model_len}" in body["error"]["message"]
    # Nothing ran: the orchestrator cancels the reservation before answering (relay.py).
    row = await fleet.ledger_row(request_id)
    assert row is not None
    assert (row.status, row.prompt_tokens, row.completion_tokens, row.cost_microcredits) == (
        "cancelled",
        0,
        0,
        0,
    )
    assert await fleet.team_money() == (balance_before, 0)
    assert await fleet.engine_token_deltas(before) == (0, 0)
