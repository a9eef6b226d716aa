"""vLLM's per-request `priority` under `--scheduling-policy priority`: accepted by enginesim and the
real vLLM alike, and on both the waiting queue is ordered by it: with the batch full, the higher
priority (lower value) is scheduled ahead of requests that waited longer (the orchestrator sends
`interactive` as 0 and `batch` as 10). Through the platform: `test_priority_platform_conformance.py`.

Certain on a machine of any speed (`slots.py`): every request is queued in a paused engine, in a
known order confirmed by the engine itself, then all are released at once; who was scheduled
before whom is read afterwards from each request's `cached_tokens`.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from apps.core.sharing import VLLM_PRIORITY, PriorityClass
from tests.conformance.conftest import MAX_NUM_SEQS, EngineUnderTest
from tests.conformance.helpers import chat_body, stream_chat
from tests.conformance.slots import paused_engine, run_tag, words

# What the orchestrator sends for each class (0 and 10).
INTERACTIVE, BATCH = VLLM_PRIORITY[PriorityClass.INTERACTIVE], VLLM_PRIORITY[PriorityClass.BATCH]
WAITING_BATCH = 4
ANSWER = 16
# A prompt prefix several KV blocks long on both engines (blocks of 16 tokens on enginesim, 128 on
# the real vLLM on CPU; the tiny model's BPE makes each of these words 5-7 tokens).
PREFIX_WORDS = 60


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=120.0) as c:
        yield c


def test_priority_field_is_accepted(engine: EngineUnderTest, client: httpx.Client) -> None:
    for priority in (INTERACTIVE, BATCH):
        body = chat_body(engine.model, max_tokens=3, stream=True, priority=priority)
        res = stream_chat(client, engine.url, body)
        assert res.status == 200, res.payloads
        assert res.payloads[-1] == "[DONE]"


async def test_the_first_free_slot_goes_to_the_interactive_request(engine: EngineUnderTest) -> None:
    """`max_num_seqs` batch requests ("fills"), then K more batch requests, then one interactive
    request are queued, in that order, in the paused engine; the K batch ones and the interactive
    one share a prompt prefix. Released together, the scheduler fills its `max_num_seqs` seats by
    priority: the interactive request first, although it came last, then the oldest fills; the
    K batch requests take seats only as fills end. So the interactive request computed the shared
    prefix (it found nothing cached) and every one of the K found it cached. Under fcfs (or with
    the priority dropped) the first of the K would have computed it and the interactive request
    would have found it cached."""
    tag = run_tag()
    shared = words(f"s{tag}x", PREFIX_WORDS)
    async with paused_engine(engine.url, engine.model) as eng:
        for i in range(MAX_NUM_SEQS):
            await eng.queued(eng.chat(f"fill{i}", words(f"f{i}{tag}x", 4), BATCH, ANSWER))
        waiting = []
        for i in range(WAITING_BATCH):
            waiting.append(eng.chat(f"b{i}", f"{shared} b{i}", BATCH, ANSWER))
            await eng.queued(waiting[-1])
        urgent = eng.chat("urgent", f"{shared} urgent", INTERACTIVE, ANSWER)
        await eng.queued(urgent)
        await eng.release()
        await eng.all_ended()
    assert urgent.cached_tokens == 0
    assert [w.cached_tokens > 0 for w in waiting] == [True] * WAITING_BATCH, [w.usage for w in waiting]
