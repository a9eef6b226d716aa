"""enginesim's prefix cache and pause, as vLLM 0.32 has them: the scheduler rules in simulated time,
and the dev-mode routes and usage details over HTTP."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace

import aiohttp
import pytest

from apps.core.batching.prefix_cache import block_hashes
from apps.core.batching.scheduler import Scheduler, Sequence
from apps.enginesim.profiles import TINY
from apps.enginesim.server import EngineSimSettings, RunningEngine, start_enginesim

BS = TINY.block_size  # 16


def _seq(name: str, tokens: list[int], out: int = 4, priority: int = 0, salt: str | None = None) -> Sequence:
    return Sequence(
        name,
        len(tokens),
        out,
        "length",
        arrival_s=0.0,
        priority=priority,
        block_hashes=block_hashes(tokens, BS, salt),
    )


def _run(sched: Scheduler) -> None:
    for _ in range(10_000):
        if not sched.has_work():
            return
        sched.step()
    raise AssertionError("the scheduler never went idle")


SHARED = list(range(100, 100 + 5 * BS))  # five full blocks


def test_block_hashes_chain_over_the_shared_prefix_and_the_salt() -> None:
    a = block_hashes([*SHARED, 1, 2, 3], BS)
    b = block_hashes([*SHARED, *range(7, 7 + BS)], BS)
    assert len(a) == 5
    assert len(b) == 6
    assert a == b[:5]
    assert block_hashes(SHARED, BS, "team-a")[0] != a[0]
    changed = [*SHARED]
    changed[BS] += 1  # the second block differs: it and every later one
    assert block_hashes(changed, BS)[:1] == a[:1]
    assert block_hashes(changed, BS)[1] != a[1]


def test_a_later_request_finds_the_shared_blocks_cached_and_computes_the_rest() -> None:
    sched = Scheduler(TINY)
    first = _seq("first", [*SHARED, 1, 2])
    sched.add(first)
    _run(sched)
    second = _seq("second", [*SHARED, 9, 9, 9])
    sched.add(second)
    step = sched.step()
    assert (first.num_cached_tokens, second.num_cached_tokens) == (0, 5 * BS)
    assert step.prefill_tokens == 3  # only the tokens past the cached blocks are computed
    assert (sched.prefix.queries, sched.prefix.hits) == (first.prompt_tokens + second.prompt_tokens, 5 * BS)
    assert sched.created_cache_tokens(first) == 5 * BS
    assert sched.created_cache_tokens(second) == 0


def test_a_request_seated_later_in_the_same_step_hits_the_blocks_of_one_seated_before_it() -> None:
    sched = Scheduler(TINY, "priority")
    late = _seq("late", [*SHARED, 1], priority=10)
    early = _seq("early", [*SHARED, 2], priority=0)
    sched.add(late)
    sched.add(early)
    sched.step()
    assert (early.num_cached_tokens, late.num_cached_tokens) == (0, 5 * BS)


def test_the_last_token_is_always_computed() -> None:
    sched = Scheduler(TINY)
    sched.add(_seq("a", SHARED))
    _run(sched)
    again = _seq("b", SHARED)  # exactly the cached blocks: the last block is computed again
    sched.add(again)
    sched.step()
    assert again.num_cached_tokens == 4 * BS


def test_cached_blocks_count_as_free_and_are_reused_oldest_first() -> None:
    profile = replace(TINY, num_blocks=13)  # 12 usable blocks
    sched = Scheduler(profile)
    old = _seq("old", list(range(1000, 1000 + 3 * BS)), out=1)
    new = _seq("new", list(range(2000, 2000 + 3 * BS)), out=1)
    for s in (old, new):
        sched.add(s)
        _run(sched)
    assert sched.free_blocks == 12
    assert len(sched.prefix.evictable) == 6
    big = Sequence("big", 9 * BS, 1, "length", arrival_s=0.0)  # 9 blocks: 6 empty ones, then 3 cached
    sched.add(big)
    sched.step()
    assert len(sched.prefix.evictable) == 3
    probe_old = _seq("probe-old", [*range(1000, 1000 + 3 * BS), 1])
    probe_new = _seq("probe-new", [*range(2000, 2000 + 3 * BS), 1])
    assert sched.prefix.match(probe_old.block_hashes, 3) == 0  # the oldest were reused
    assert sched.prefix.match(probe_new.block_hashes, 3) == 3


def test_pause_keep_freezes_and_clear_cache_puts_running_requests_back() -> None:
    sched = Scheduler(TINY, "priority")
    running = _seq("running", [*SHARED, 1], out=100)
    sched.add(running)
    sched.step()
    sched.paused_all = True
    waiting = _seq("waiting", [*SHARED, 2], out=4)
    sched.add(waiting)
    assert not sched.has_work()
    assert sched.step().batch == 0
    assert running.generated == 1
    preempted = sched.reset_prefix_cache(reset_running=True)
    assert preempted == ["running"]
    assert not sched.running
    assert len(sched.waiting) == 2
    assert not sched.prefix.evictable
    assert not sched.prefix.in_use
    sched.paused_all = False
    sched.step()
    assert waiting.num_cached_tokens == 0  # the cache was emptied


def test_pause_wait_lets_the_running_finish_and_admits_none() -> None:
    sched = Scheduler(TINY)
    running = Sequence("running", 4, 3, "length", arrival_s=0.0)
    sched.add(running)
    sched.step()
    sched.paused_new = True
    queued = Sequence("queued", 4, 3, "length", arrival_s=0.0)
    sched.add(queued)
    _run(sched)
    assert running.generated == 3
    assert queued.generated == 0
    assert list(sched.waiting) == [queued]


@pytest.fixture
async def sim() -> AsyncIterator[RunningEngine]:
    settings = EngineSimSettings(
        model="tiny",
        port=0,
        speed=50,
        dev_mode=True,
        enable_prompt_tokens_details=True,
        scheduling_policy="priority",
    )
    running = await start_enginesim(settings)
    try:
        yield running
    finally:
        await running.close()


async def _usage(session: aiohttp.ClientSession, url: str, content: str, stream: bool) -> dict[str, object]:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 2,
        "stream": stream,
        "stream_options": {"include_usage": True} if stream else None,
    }
    async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        if not stream:
            usage: dict[str, object] = (await resp.json())["usage"]
            return usage
        lines = [ln for ln in (await resp.text()).splitlines() if ln.startswith("data: {")]
    final: dict[str, object] = json.loads(lines[-1][6:])["usage"]
    return final


async def test_usage_says_what_was_cached_as_vllm_does(sim: RunningEngine) -> None:
    prefix = " ".join(f"w{i}" for i in range(40))
    async with aiohttp.ClientSession() as session:
        first = await _usage(session, sim.url, prefix + " one", stream=True)
        second = await _usage(session, sim.url, prefix + " two", stream=False)
    # 48 prompt tokens (the chat template's 7 around 41 words): 3 full blocks, 2 of them shared.
    assert first["prompt_tokens_details"] == {"cached_tokens": 0, "created_cache_tokens": 48}
    assert second["prompt_tokens_details"] == {
        "cached_tokens": 32,
        "created_cache_tokens": 16,
        "multimodal_tokens": None,
    }


async def test_dev_mode_routes_pause_and_resume(sim: RunningEngine) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{sim.url}/pause", params={"mode": "abort"}) as resp:
            assert resp.status == 400
            assert "not simulated" in (await resp.json())["error"]
        async with session.post(f"{sim.url}/pause", params={"mode": "keep", "clear_cache": "maybe"}) as resp:
            assert resp.status == 400
        async with session.post(f"{sim.url}/pause", params={"mode": "keep"}) as resp:
            assert resp.status == 200
        async with session.get(f"{sim.url}/is_paused") as resp:
            assert await resp.json() == {"is_paused": True}
        async with session.post(f"{sim.url}/resume") as resp:
            assert resp.status == 200
        async with session.get(f"{sim.url}/is_paused") as resp:
            assert await resp.json() == {"is_paused": False}


async def test_dev_mode_routes_exist_only_in_dev_mode() -> None:
    running = await start_enginesim(EngineSimSettings(model="tiny", port=0))
    try:
        async with aiohttp.ClientSession() as session, session.post(f"{running.url}/pause") as resp:
            assert resp.status == 404
    finally:
        await running.close()
