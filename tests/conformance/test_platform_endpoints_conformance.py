"""`/v1/completions` and `/v1/embeddings` through the platform's node path (issue 31): a real
orchestrator and a real agent in front of enginesim, and of the real vLLM in the `realvllm` stage
(a generating engine for completions, a pooling one for embeddings). Each request is dispatched as
the gateway sends it, after a reservation as the gateway makes it, and settles in the real ledger at
the engine's own counts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conformance.agent_env import AgentFleet, agent_fleet, cost, fleet
from tests.conformance.conftest import HIDDEN_SIZE, EngineUnderTest

__all__ = ["fleet"]  # the fixture, imported from agent_env
ANSWER = 5
PROMPT_BOUND = 64  # the gateway's conservative estimate of the prompt (the reservation's cap)


@pytest.fixture
async def pooling_fleet(
    pooling_engine: EngineUnderTest, migrated_db_url: str, redis_url: str, tmp_path: Path
) -> AsyncIterator[AgentFleet]:
    async with agent_fleet(pooling_engine, migrated_db_url, redis_url, tmp_path) as env:
        yield env


async def test_a_streamed_completion_is_relayed_and_settled_at_the_engines_counts(fleet: AgentFleet) -> None:
    request_id = await fleet.reserve(ANSWER, PROMPT_BOUND)
    body = {
        "model": fleet.engine.model,
        "prompt": "Once upon a time",
        "max_tokens": ANSWER,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    before = await fleet.engine_metrics()
    out = await fleet.dispatch(
        request_id,
        body,
        wants_usage=True,
        endpoint="completions",
        max_prompt_tokens=PROMPT_BOUND,
        max_completion_tokens=ANSWER,
        n=1,
    )
    assert out.status == 200, out.payloads
    assert out.payloads[-1] == "[DONE]"
    chunks = out.chunks
    texts = [c for c in chunks if c.get("choices")]
    assert all(c["object"] == "text_completion" for c in texts)
    assert len(texts) == ANSWER  # one event per token, no role chunk
    assert texts[-1]["choices"][0]["finish_reason"] == "length"
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == []
    assert usage["completion_tokens"] == ANSWER
    row = await fleet.final_row(request_id)
    assert (row.status, row.prompt_tokens, row.completion_tokens) == (
        "settled",
        usage["prompt_tokens"],
        ANSWER,
    )
    assert row.cost_microcredits == cost(usage["prompt_tokens"], ANSWER)
    assert await fleet.engine_token_deltas(before, (usage["prompt_tokens"], ANSWER)) == (
        usage["prompt_tokens"],
        ANSWER,
    )


async def test_an_embeddings_answer_is_relayed_whole_and_billed_for_its_input(
    pooling_fleet: AgentFleet,
) -> None:
    fleet = pooling_fleet
    request_id = await fleet.reserve(0, PROMPT_BOUND)
    body = {"model": fleet.engine.model, "input": ["the cat sat on the mat", "a dog ran"]}
    out = await fleet.dispatch(
        request_id,
        body,
        wants_usage=True,
        endpoint="embeddings",
        max_prompt_tokens=PROMPT_BOUND,
        max_completion_tokens=0,
        n=1,
    )
    assert out.status == 200, out.payloads
    assert out.payloads[-1] == "[DONE]"
    (answer,) = out.chunks  # the engine's body, one event
    assert answer["object"] == "list"
    assert [d["index"] for d in answer["data"]] == [0, 1]
    assert all(len(d["embedding"]) == HIDDEN_SIZE for d in answer["data"])
    prompt = answer["usage"]["prompt_tokens"]
    assert prompt > 0
    row = await fleet.final_row(request_id)
    assert (row.status, row.prompt_tokens, row.completion_tokens) == ("settled", prompt, 0)
    assert row.cost_microcredits == cost(prompt, 0)
