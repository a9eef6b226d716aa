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

On the real vLLM the (1 running, 1 waiting) state cannot be caught while it lasts: the tiny model
makes a decode step in well under a millisecond on CPU, so even an 8,000-token window was over in
about half a second while one `/metrics` read took seconds (measured 2026-12-05), and vLLM 0.32
reports preemptions only in aggregate (`num_preemptions_total`, `request_num_preemptions`). So the
real engine's verdict is read afterwards from its KV cache events (`--kv-events-config`, read by
`kvevents.py`): a preempted request loses its blocks and, once it runs again, computes them again,
so its blocks are stored twice. The other request's blocks are stored once. Which one was preempted
is then a fact in the engine's own log, whatever the machine's speed: the arithmetic below fixes that
exactly one of them is preempted, and the chains of block hashes tell which.

On the real vLLM (KV cache of 16 blocks of 128 tokens, the CPU backend's block size; prefix caching
on; one step's budget the whole context): both requests are seated in the first step (about 1,820
tokens in 15 + 1 blocks: the cache is full), and grow a token a step each, so within about 110 steps
the interactive request needs its second block, there is none, and one of them is preempted. With
the batch request preempted (its 15 blocks freed, still cached), the interactive one grows to about
2,020 tokens, takes every block, and so evicts the batch request's cached blocks; when the batch
request runs again it computes them again: stored twice. Had the interactive request been preempted
(class dropped, or fcfs), the batch request would never be computed again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.core.sharing import VLLM_PRIORITY, PriorityClass
from tests.conformance.conftest import VLLM_CAP_S, EngineUnderTest, serve_enginesim, serve_vllm
from tests.conformance.kvevents import KvEventLog, prompt_ids, prompt_of, stored_after
from tests.conformance.slots import paused_engine, run_tag

KV_TOKENS = 2048
MAX_MODEL_LEN = 2048
BATCH_PROMPT, BATCH_ANSWER = 1800, 200  # tokens, about (the template's tokens included)
INTERACTIVE_PROMPT, INTERACTIVE_ANSWER = 20, 2000
BLOCK = 16  # enginesim's tiny profile
VLLM_CPU_BLOCK = 128  # vLLM 0.32's default block size on the CPU backend
# The tiny Llama's KV cache per token (tools/build_tiny_llama.py): K and V x 2 layers x 2 KV heads x
# 32 dims x 4 bytes (float32). One block more than 2,048 tokens: vLLM keeps a null block.
TINY_KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 4
PREFIX = 16  # prompt tokens that tell the two requests' first blocks apart
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


@pytest.fixture(scope="module")
def small_kv_vllm(
    tiny_llama: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[EngineUnderTest, KvEventLog]]:
    """A second real vLLM: 2,048 tokens of KV cache, publishing its KV events on a loopback port."""
    python, model_dir = tiny_llama
    work = tmp_path_factory.mktemp("vllm-small-kv")
    # An ipc endpoint: vLLM binds it (a tcp endpoint with a host, vLLM connects to, for a subscriber
    # that binds: `_is_bind_endpoint` in vllm/distributed/kv_events.py).
    endpoint = f"ipc://{work}/kv-events.sock"
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "topic": "kv"}
    log = KvEventLog(endpoint)
    log.start()
    try:
        yield from (
            (engine, log)
            for engine in serve_vllm(
                python, model_dir, work,
                str((KV_TOKENS + VLLM_CPU_BLOCK) * TINY_KV_BYTES_PER_TOKEN),
                extra=("--kv-events-config", json.dumps(events), "--max-num-batched-tokens", str(MAX_MODEL_LEN)),
            )
        )  # fmt: skip
    finally:
        log.stop()


async def test_kv_pressure_preempts_the_batch_request_not_the_interactive_one(
    small_kv_engine: EngineUnderTest,
) -> None:
    engine, tag = small_kv_engine, run_tag()
    batch_text = await prompt_of(engine, f"b{tag}x", BATCH_PROMPT)
    interactive_text = await prompt_of(engine, f"i{tag}x", INTERACTIVE_PROMPT)
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


@pytest.mark.realvllm
@pytest.mark.timeout(VLLM_CAP_S + 300)
async def test_kv_pressure_on_the_real_vllm_preempts_the_batch_request(
    small_kv_vllm: tuple[EngineUnderTest, KvEventLog],
) -> None:
    engine, log = small_kv_vllm
    tag = run_tag()
    await stored_after(engine, log, f"w{tag}x")  # the subscription is live: an event of ours arrived
    batch_text = await prompt_of(engine, f"b{tag}x", BATCH_PROMPT)
    interactive_text = await prompt_of(engine, f"i{tag}x", INTERACTIVE_PROMPT)
    batch_first = tuple((await prompt_ids(engine, batch_text))[:PREFIX])
    interactive_first = tuple((await prompt_ids(engine, interactive_text))[:PREFIX])
    assert batch_first != interactive_first
    async with paused_engine(engine.url, engine.model) as eng:
        before = await eng.state()
        batch = eng.chat("batch", batch_text, BATCH, BATCH_ANSWER)
        await eng.queued(batch)
        interactive = eng.chat("interactive", interactive_text, INTERACTIVE, INTERACTIVE_ANSWER)
        await eng.queued(interactive)
        await eng.release()
        await eng.all_ended()
        after = await eng.state()
    await stored_after(engine, log, f"z{tag}x")  # every event of the two requests has arrived
    assert log.gaps == 0, f"the log lost messages: {log.summary()}"
    assert after.preemptions - before.preemptions >= 1, f"no preemption: {before} -> {after}"
    batch_blocks, interactive_blocks = log.chain_from(batch_first), log.chain_from(interactive_first)
    assert len(batch_blocks) >= BATCH_PROMPT // log.block_size, (
        f"the batch request's blocks: {len(batch_blocks)}"
    )
    assert len(interactive_blocks) >= INTERACTIVE_ANSWER // log.block_size, (
        f"interactive blocks: {len(interactive_blocks)}"
    )
    computed_again = (log.stored_twice(batch_blocks), log.stored_twice(interactive_blocks))
    assert computed_again[1] == 0, (
        f"the interactive request was preempted: blocks computed twice {computed_again}"
    )
    assert computed_again[0] > 0, f"the batch request was never computed again: {computed_again}"
