"""Aborts under load are billed the engine's own count (enginesim, and the real vLLM in `realvllm`).

Several concurrent long streams through a real orchestrator and agent; each client asks for the
engine's per-chunk usage itself (`continuous_usage_stats`), so it sees the engine's running count
on every chunk the node forwarded. Mid-stream the agent aborts them all (a drain with deadline 0:
the abort path, upstream connections closed), while the clients keep reading to the end, so they
have seen every chunk the node saw. Checked: each settled row equals the engine's last running
usage (summed over choices), never the chunk count where vLLM merged tokens; the engine's own
counters cover what was billed; the ledger invariant (balance moved by exactly the settled costs,
nothing left reserved). A client that disconnects is billed at least what it was sent.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tests.conformance.agent_env import AgentFleet, cost, fleet, poll
from tests.conformance.conftest import MAX_NUM_SEQS

LONG = 1000  # with the 8-token prompt, fits max-model-len 1024
# Content chunks every stream has received before the abort: few, so the abort beats completion
# on the fast real model too (docs/vllm-facts.md §4); the client-disconnect test waits for more.
ABORT_AFTER = 3
CHUNK_USAGE = {"include_usage": True, "continuous_usage_stats": True}
__all__ = ["fleet"]  # the fixture, imported from agent_env


class Seen:
    """What one client saw: content chunks, and the engine's running usage per choice."""

    def __init__(self) -> None:
        self.content_chunks = 0
        self.running: dict[int, int] = {}
        self.prompt_tokens = 0
        self.final: dict[str, int] | None = None
        self.error: dict[str, Any] | None = None
        self.ended = False

    def note(self, payload: str) -> None:
        if payload == "[DONE]":
            self.ended = True
            return
        chunk: dict[str, Any] = json.loads(payload)
        if "error" in chunk:  # a drain hands a stream with output off; with no other node: this event
            self.error = chunk["error"]
            return
        usage = chunk.get("usage")
        if not chunk["choices"]:
            self.final = usage
            return
        assert usage is not None, "asked for per-chunk usage, got a chunk without it"
        (choice,) = chunk["choices"]
        if "role" not in choice["delta"]:
            self.content_chunks += 1
        self.running[choice["index"]] = usage["completion_tokens"]
        self.prompt_tokens = usage["prompt_tokens"]

    @property
    def engine_count(self) -> int:
        return self.final["completion_tokens"] if self.final else sum(self.running.values())


async def test_aborts_under_load_settle_the_engines_running_usage(fleet: AgentFleet) -> None:
    streams = MAX_NUM_SEQS
    before = await fleet.engine_metrics()
    balance_before, _ = await fleet.team_money()
    ids = [await fleet.reserve(LONG) for _ in range(streams)]
    seen = {rid: Seen() for rid in ids}
    all_going = asyncio.Event()

    async def client(rid: str) -> None:
        async with fleet.open_dispatch(
            rid, fleet.body(LONG, usage=None, stream_options=CHUNK_USAGE), wants_usage=True
        ) as resp:
            assert resp.status == 200
            async for line in resp.content:
                text = line.decode().strip()
                if text.startswith("data:"):
                    seen[rid].note(text[5:].strip())
                    if all(s.content_chunks >= ABORT_AFTER or s.ended for s in seen.values()):
                        all_going.set()

    async with asyncio.timeout(90):
        async with asyncio.TaskGroup() as group:
            for rid in ids:
                group.create_task(client(rid))
            await all_going.wait()
            fleet.agent.drain(0.0, reason="abort under load")  # every running request aborted at once

    assert all(s.ended for s in seen.values())
    await poll(fleet.engine_running, lambda n: n == 0, 20.0)
    rows = {rid: await fleet.final_row(rid) for rid in ids}
    merged = 0
    for rid, row in rows.items():
        s = seen[rid]
        assert row.status == "settled"
        # The engine's own count of what it generated for the chunks the node saw, exactly.
        assert (row.prompt_tokens, row.completion_tokens) == (s.prompt_tokens, s.engine_count), rid
        assert row.completion_tokens >= s.content_chunks >= ABORT_AFTER
        merged += row.completion_tokens != s.content_chunks
        assert row.cost_microcredits == cost(row.prompt_tokens, row.completion_tokens)
    if fleet.engine.traits.one_chunk_per_token:
        assert merged == 0
    # Tokens the engine ran past the last chunk it sent are not billed; nothing beyond its counters is.
    _, generated = await poll(
        lambda: fleet.engine_token_deltas(before),
        lambda d: d[1] >= sum(r.completion_tokens for r in rows.values()),
        10.0,
    )
    assert sum(r.completion_tokens for r in rows.values()) <= generated
    if fleet.engine.traits.abort_always_beats_completion:
        assert all(r.completion_tokens < LONG for r in rows.values())
    # The ledger invariant: the balance moved by exactly the settled costs; nothing left reserved.
    assert await fleet.team_money() == (balance_before - sum(r.cost_microcredits for r in rows.values()), 0)
    chunks = sum(seen[rid].content_chunks for rid in ids)
    billed = sum(r.completion_tokens for r in rows.values())
    print(
        f"\n{fleet.engine.kind}: {merged} of {streams} aborted streams had merged chunks; "
        f"{billed} completion tokens billed for {chunks} content chunks; "
        f"{sum(r.completion_tokens < LONG for r in rows.values())} cut short by the abort"
    )


async def test_a_client_that_disconnects_is_billed_at_least_what_it_was_sent(fleet: AgentFleet) -> None:
    request_id = await fleet.reserve(LONG)
    s = Seen()
    async with fleet.open_dispatch(
        request_id, fleet.body(LONG, usage=None, stream_options=CHUNK_USAGE), wants_usage=True
    ) as resp:
        assert resp.status == 200
        async with asyncio.timeout(60):
            async for line in resp.content:
                text = line.decode().strip()
                if text.startswith("data:"):
                    s.note(text[5:].strip())
                    if s.content_chunks >= ABORT_AFTER or s.ended:
                        break  # leaving the block closes the connection: the client is gone
    await poll(fleet.engine_running, lambda n: n == 0, 10.0)
    row = await fleet.final_row(request_id)
    assert row.status == "settled"
    # The node may have seen chunks that were still on their way to the client: never fewer.
    assert row.completion_tokens >= s.engine_count >= ABORT_AFTER
    assert row.prompt_tokens == s.prompt_tokens
    assert (await fleet.team_money())[1] == 0
