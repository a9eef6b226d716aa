"""vLLM's per-request `priority` under `--scheduling-policy priority`: accepted by enginesim and the
real vLLM alike, and on both, with the batch full, the higher priority (lower value) takes the
next free slot ahead of requests that waited longer (the orchestrator sends `interactive` as 0 and
`batch` as 10). Through the platform: `test_priority_platform_conformance.py`."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from apps.core.sharing import VLLM_PRIORITY, PriorityClass
from tests.conformance.conftest import MAX_NUM_SEQS, EngineUnderTest
from tests.conformance.helpers import chat_body, stream_chat
from tests.conformance.slots import Holder, conclusively, hold_body

# What the orchestrator sends for each class (0 and 10).
INTERACTIVE, BATCH = VLLM_PRIORITY[PriorityClass.INTERACTIVE], VLLM_PRIORITY[PriorityClass.BATCH]
WAITING_BATCH = 4


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


async def test_the_first_free_slot_goes_to_the_interactive_request(enginesim_server: EngineUnderTest) -> None:
    """enginesim (on the real vLLM the same property is proven through the platform,
    `test_priority_platform_conformance.py`: this variant's eight 2,000-token fills ran to their end
    before the check was done on a quiet VM, 3 of 3 runs inconclusive): `max_num_seqs` long batch requests run, K more batch requests wait, then an
    interactive one arrives. One running request is aborted (one slot frees; nothing else ends for
    hundreds of steps): the engine admits the interactive request, and every batch request that
    was waiting when it arrived is still waiting. Under fcfs the oldest batch request would take
    the slot. vLLM V1 never preempts a running request to admit a waiting one (only when a running
    one needs KV blocks), so a slot has to free first: the priority orders the waiting queue.

    Read from the engine's own scheduler state, not from arrival times: A = (full, K + 1 waiting)
    proves the interactive and the K batch requests waited together; B = (full, K) after the abort
    proves exactly one was admitted; the interactive one streaming, no batch one streaming, and the
    engine still at (full, K) with no request ended by itself, prove it was the interactive one."""
    engine = enginesim_server
    model, n, k = engine.model, MAX_NUM_SEQS, WAITING_BATCH

    async def check(held: Holder) -> None:
        fills = [held.chat(hold_body(model, f"fill{i}", BATCH), f"fill{i}") for i in range(n)]
        await held.until_state(n, 0)
        waiting = [held.chat(hold_body(model, f"b{i}", BATCH), f"b{i}") for i in range(k)]
        await held.until_state(n, k)
        urgent = held.chat(hold_body(model, "now", INTERACTIVE), "now")
        await held.until_state(n, k + 1)  # A
        fills[0].release()
        await held.until_state(n, k)  # B
        await held.until(lambda: urgent.streaming or any(w.streaming for w in waiting), "an admission")
        end = await held.engine_state()  # Inconclusive if a fill ended by itself
        assert [w.name for w in waiting if w.streaming] == []
        assert urgent.streaming
        assert (end.running, end.waiting) == (n, k)

    await conclusively(engine.url, check)
