"""Under KV-cache pressure the engine preempts the batch request, not the interactive one.

vLLM 0.32's scheduler (`vllm/v1/core/sched/scheduler.py`), when a running request cannot get KV
blocks, preempts `max(running, key=(priority, arrival_time))` under the priority policy (under
fcfs: the last request in `running`), frees its blocks and puts it back in the waiting queue to
compute again from its first token; it never preempts to admit a waiting request. enginesim
implements the same rule (`apps/core/batching/scheduler.py`), and this check runs on enginesim.

The setup (`slots.py`): a batch request with a long prompt and then an interactive one with a
short prompt are queued in a paused engine whose KV cache holds 2,048 tokens, and released
together: both are seated in the first step and grow a token a step until the cache is full and
one of them is preempted. The preempted request cannot come back while the other runs (one step's
token budget is the whole context, so it would be computed again in one piece, which does not fit
beside the other), and the interactive request has over a thousand more tokens to make: for that
long the engine shows one request running and one waiting.

The verdict, read from a frozen engine: as soon as the engine shows (1 running, 1 waiting) it is
paused ("keep", cache kept: nothing moves), and the batch request is aborted; the engine's own
snapshot after that abort is (1 running, 0 waiting) if the batch request was the waiting one, and
(0 running, 1 waiting) if the interactive one was. Had the class been dropped (both priority 0) or
the policy been fcfs, the interactive request, which came last, would have been preempted.

Not on the real vLLM: this verdict needs the check to see the (1, 1) state while it lasts, and on
the real vLLM on CPU the tiny model makes a decode step in well under a millisecond, so even an
8,000-token window was over in about half a second while one `/metrics` read took seconds (measured
2026-12-05). vLLM 0.32 reports preemptions only in aggregate (`num_preemptions_total`,
`request_num_preemptions`), so a verdict read afterwards cannot name the request either.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from apps.core.sharing import VLLM_PRIORITY, PriorityClass
from tests.conformance.conftest import EngineUnderTest, serve_enginesim
from tests.conformance.slots import paused_engine, run_tag, words

KV_TOKENS = 2048
MAX_MODEL_LEN = 2048
BATCH_PROMPT, BATCH_ANSWER = 1800, 200  # tokens, about (the template's tokens included)
INTERACTIVE_PROMPT, INTERACTIVE_ANSWER = 20, 2000
BLOCK = 16  # enginesim's tiny profile
INTERACTIVE, BATCH = VLLM_PRIORITY[PriorityClass.INTERACTIVE], VLLM_PRIORITY[PriorityClass.BATCH]


@pytest.fixture(scope="module")
def small_kv_enginesim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineUnderTest]:
    yield from serve_enginesim(
        tmp_path_factory.mktemp("enginesim-small-kv"),
        "--num-blocks", str(KV_TOKENS // BLOCK + 1),  # + the null block, as vLLM
        "--max-model-len", str(MAX_MODEL_LEN),
        "--no-enable-prefix-caching",
        "--max-num-batched-tokens", str(MAX_MODEL_LEN),
    )  # fmt: skip


@pytest.fixture
def small_kv_engine(small_kv_enginesim: EngineUnderTest) -> EngineUnderTest:
    return small_kv_enginesim


async def _prompt_of(engine: EngineUnderTest, tag: str, tokens: int) -> str:
    """Words unique to this run, as many as make about `tokens` prompt tokens on this engine."""
    async with httpx.AsyncClient(timeout=60.0) as client:

        async def count(text: str) -> int:
            body = {"model": engine.model, "messages": [{"role": "user", "content": text}]}
            resp = await client.post(f"{engine.url}/tokenize", json=body)
            assert resp.status_code == 200, resp.text
            return int(resp.json()["count"])

        base = await count("")
        per_word = (await count(words(tag, 50)) - base) / 50
        n = max(1, round((tokens - base) / per_word))
        for _ in range(6):  # a bounded refinement: each word is a few BPE tokens
            got = await count(words(tag, n))
            if abs(got - tokens) <= tokens // 50 + 4:
                return words(tag, n)
            n = max(1, n + round((tokens - got) / per_word))
        raise AssertionError(f"no prompt of about {tokens} tokens: {n} words make {got}")


async def test_kv_pressure_preempts_the_batch_request_not_the_interactive_one(
    small_kv_engine: EngineUnderTest,
) -> None:
    engine, tag = small_kv_engine, run_tag()
    batch_text = await _prompt_of(engine, f"b{tag}x", BATCH_PROMPT)
    interactive_text = await _prompt_of(engine, f"i{tag}x", INTERACTIVE_PROMPT)
    async with paused_engine(engine.url, engine.model) as eng:
        batch = eng.chat("batch", batch_text, BATCH, BATCH_ANSWER)
        await eng.queued(batch)
        interactive = eng.chat("interactive", interactive_text, INTERACTIVE, INTERACTIVE_ANSWER)
        await eng.queued(interactive)
        await eng.release()
        await eng.until(lambda s: (s.running, s.waiting) == (1, 1), "one request preempted")
        await eng.freeze()
        frozen = await eng.state()  # the last step's snapshot: nothing moves until released
        assert (frozen.running, frozen.waiting) == (1, 1), f"moved on before the check froze it: {frozen}"
        assert batch.task is not None
        batch.task.cancel()  # its connection closes: the engine aborts it and takes a snapshot
        after = await eng.until(lambda s: s.running + s.waiting == 1, "the abort of the batch request")
        assert not interactive.ended, "the interactive request ended before the check looked"
    assert (after.running, after.waiting) == (1, 0), f"the interactive request was the one waiting: {after}"
