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

import aiohttp

from tests.conformance.agent_env import AgentFleet, cost, fleet, is_content, poll
from tests.conformance.conftest import MAX_NUM_SEQS, EngineUnderTest

LONG = 1000  # with the 8-token prompt, fits max-model-len 1024
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


async def _engine_load(engine: EngineUnderTest, streams: int) -> int:
    """`streams` concurrent long streams straight to the engine: six times its max-num-seqs, so
    requests wait for five rounds of 600 tokens (several heartbeats long even on a fast CPU: with
    three rounds of 400 tokens a 2-vCPU EPYC VM ran the real engine's queue dry between two beats)."""
    body = {
        "model": engine.model,
        "messages": [{"role": "user", "content": "hello " * 300}],
        "max_tokens": 600,
        "ignore_eos": True,
        "stream": True,
    }

    async def one(own: aiohttp.ClientSession) -> int:
        async with own.post(f"{engine.url}/v1/chat/completions", json=body) as resp:
            await resp.read()
            return resp.status

    # A fresh connection per stream: a second round on the shared pool could pick a keep-alive
    # connection the engine's uvicorn is closing at that moment (its 5 s idle timeout), which aiohttp
    # reports as ServerDisconnectedError before any byte (seen once in CI on the real vLLM).
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True, limit=0)) as own:
        statuses = await asyncio.gather(*(one(own) for _ in range(streams)))
    return sum(1 for s in statuses if s == 200)


async def test_heartbeats_carry_the_engine_queue_and_kv_use(fleet: AgentFleet) -> None:
    engine = fleet.engine
    node = await poll(
        fleet.node, lambda n: n["state"] == "ready" and n["last_heartbeat_age_s"] is not None, 10.0
    )
    assert node["models"] == [engine.model]
    samples: list[dict[str, object]] = []

    def seen_load() -> bool:
        waiting = any(int(str(s["queue_depth"])) > 0 for s in samples)
        kv = any(float(str(s["kv_cache_usage"])) > 0.0 for s in samples)
        return waiting and (kv or not engine.traits.kv_usage_observable_under_load)

    # One load keeps the engine's queue non-empty for about a second on a fast CPU, a couple of
    # heartbeats: load again (bounded) until a beat has caught it, so timing cannot make this flaky.
    # The load runs on an event loop of its own (a thread): on the test's loop, reading its 36
    # streams queued the agent's heartbeats and the orchestrator's reads behind thousands of chunk
    # callbacks, so on a loaded machine the orchestrator missed the beats, closed the node's socket
    # and dropped its heartbeat hash, and a sample had `queue_depth` None.
    async with asyncio.timeout(90):
        while not seen_load():
            load = asyncio.create_task(
                asyncio.to_thread(asyncio.run, _engine_load(engine, streams=6 * MAX_NUM_SEQS))
            )
            while not load.done():
                samples.append(await fleet.node())
                await asyncio.sleep(0.1)  # sampling interval while the load runs (not a wait for an event)
            assert await load == 6 * MAX_NUM_SEQS
    for sample in samples:
        assert isinstance(sample["queue_depth"], int)
        assert sample["queue_depth"] >= 0
        kv = sample["kv_cache_usage"]
        assert isinstance(kv, float)
        assert 0.0 <= kv <= 1.0
        if shutil.which("nvidia-smi") is None:  # a CPU machine: no GPU reading, and none made up
            assert sample["gpu_util"] is None
    if engine.traits.kv_usage_observable_under_load:
        assert max(float(str(s["kv_cache_usage"])) for s in samples) > 0.0
    # Both engines show the waiting requests (more streams than max-num-seqs) in the beats.
    assert max(int(str(s["queue_depth"])) for s in samples) > 0
    # Back to idle: the heartbeats follow the engine's gauges down.
    await poll(fleet.node, lambda n: n["queue_depth"] == 0 and n["kv_cache_usage"] == 0.0, 20.0)


async def test_engine_400_reaches_the_client_and_cancels_the_reservation(fleet: AgentFleet) -> None:
    engine = fleet.engine
    before = await fleet.engine_metrics()
    balance_before, _ = await fleet.team_money()
    request_id = await fleet.reserve(5000)

    res = await fleet.dispatch(request_id, fleet.body(5000), wants_usage=True)

    # Engine refused the body before any output: its status with `param`, nothing retried
    # (apps/core/protocol/dispatch.py; README "engine answer" table: 400 -> 400 invalid_request_error).
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
