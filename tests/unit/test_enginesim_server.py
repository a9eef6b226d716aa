"""enginesim in-process: faults, disconnect abort, loading phase, stop strings, the OpenAI SDK."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest

from apps.core.errors import SpecError
from apps.enginesim.faults import Faults
from apps.enginesim.server import EngineSimSettings, RunningEngine, start_enginesim


@pytest.fixture
async def sim() -> AsyncIterator[RunningEngine]:
    running = await start_enginesim(EngineSimSettings(model="tiny", port=0, speed=20))
    try:
        yield running
    finally:
        await running.close()


def _body(**extra: object) -> dict[str, object]:
    return {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}], **extra}


async def _events(resp: aiohttp.ClientResponse) -> list[str]:
    out = []
    async for line in resp.content:
        text = line.decode().strip()
        if text.startswith("data: "):
            out.append(text[6:])
    return out


async def _poll(predicate, deadline_s: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met before the deadline")


async def test_fail_status_fault_hits_next_request_only(sim: RunningEngine) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{sim.url}/_sim/faults", json={"fail_status": 503, "times": 1}) as r:
            assert r.status == 200
        first = await s.post(f"{sim.url}/v1/chat/completions", json=_body(max_tokens=2))
        assert first.status == 503
        err = (await first.json())["error"]
        assert err["code"] == 503
        assert set(err) == {"message", "type", "param", "code"}
        async with s.post(f"{sim.url}/v1/chat/completions", json=_body(max_tokens=2)) as second:
            assert second.status == 200
        assert (await (await s.get(f"{sim.url}/_sim/faults")).json())["fail_status"] is None


async def test_die_after_tokens_drops_the_connection(sim: RunningEngine) -> None:
    sim.set_faults(Faults(die_after_tokens=3))
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            f"{sim.url}/v1/chat/completions", json=_body(max_tokens=50, ignore_eos=True, stream=True)
        ) as resp,
    ):
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await _events(resp)
    sched = sim.state.engine.scheduler
    await _poll(lambda: not sched.has_work())
    assert sched.used_blocks == 0


async def test_stall_pauses_the_stream(sim: RunningEngine) -> None:
    # Measured from the request, not between two arrivals: the gap the client sees between the 2nd
    # and 3rd token is the engine's pause minus how much later it read the 2nd than the 3rd, which
    # on a loaded machine (both in one read) fell under the pause. The 3rd token cannot arrive
    # sooner than the pause after the request was sent (asyncio.sleep never returns early): a bound
    # that load only moves away from. Without the stall the 3rd token comes 5-15 ms after the request.
    sim.set_faults(Faults(stall_s=0.3, stall_after_tokens=2))
    arrivals: list[float] = []
    async with aiohttp.ClientSession() as s:
        sent = time.monotonic()
        resp = await s.post(
            f"{sim.url}/v1/chat/completions", json=_body(max_tokens=4, ignore_eos=True, stream=True)
        )
        async for line in resp.content:
            if line.startswith(b'data: {"id"') and b'"role"' not in line:
                arrivals.append(time.monotonic())
    assert len(arrivals) == 4
    assert arrivals[2] - sent >= 0.3


async def test_client_disconnect_aborts_and_frees_blocks() -> None:
    # Speed 1: 1,000 tokens take over a second, so the request is surely still running at the disconnect.
    sim = await start_enginesim(EngineSimSettings(model="tiny", port=0, speed=1))
    try:
        sched = sim.state.engine.scheduler
        async with aiohttp.ClientSession() as s:
            resp = await s.post(
                f"{sim.url}/v1/chat/completions", json=_body(max_tokens=1000, ignore_eos=True, stream=True)
            )
            async for line in resp.content:
                if b'"content":" ' in line:
                    break
            assert sched.used_blocks > 0
            resp.close()
        await _poll(lambda: sched.used_blocks == 0 and not sched.has_work())
        metrics = sim.state.metrics
        assert metrics.success["abort"]._value.get() == 0  # real vLLM does not count client aborts
        assert sum(c._value.get() for c in metrics.success.values()) == 0
        assert 1 <= metrics.generation_tokens._value.get() < 1000
    finally:
        await sim.close()


async def test_loading_refuses_connections_then_serves() -> None:
    running = await start_enginesim(EngineSimSettings(model="tiny", port=0, loading_s=0.3))
    try:
        async with aiohttp.ClientSession() as s:
            with pytest.raises(aiohttp.ClientConnectorError):
                await s.get(f"{running.url}/health")
            end = time.monotonic() + 10
            status = None
            while time.monotonic() < end:
                try:
                    async with s.get(f"{running.url}/health") as health:
                        status = health.status
                    break
                except aiohttp.ClientConnectorError:
                    await asyncio.sleep(0.05)
            assert status == 200
    finally:
        await running.close()


async def test_stop_string_ends_with_stop(sim: RunningEngine) -> None:
    async with aiohttp.ClientSession() as s:
        full = await (
            await s.post(f"{sim.url}/v1/chat/completions", json=_body(max_tokens=20, ignore_eos=True, seed=7))
        ).json()
        words = full["choices"][0]["message"]["content"].split()
        stop = words[5]
        cut = await (
            await s.post(
                f"{sim.url}/v1/chat/completions",
                json=_body(max_tokens=20, ignore_eos=True, seed=7, stop=[stop]),
            )
        ).json()
    choice = cut["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] == stop
    assert stop not in choice["message"]["content"].split()
    assert cut["usage"]["completion_tokens"] <= 6


async def test_continuous_usage_stats_put_each_choices_running_count_on_every_chunk(
    sim: RunningEngine,
) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = _body(max_tokens=4, ignore_eos=True, n=2, stream=True, stream_options=options)
    async with aiohttp.ClientSession() as s, s.post(f"{sim.url}/v1/chat/completions", json=body) as resp:
        events = await _events(resp)
    chunks = [json.loads(e) for e in events[:-1]]
    *per_chunk, final = chunks
    running: dict[int, int] = {}
    for c in per_chunk:
        (choice,) = c["choices"]
        index = choice["index"]
        expected = 0 if "role" in choice["delta"] else running.get(index, 0) + 1
        running[index] = expected
        assert c["usage"] == {
            "prompt_tokens": final["usage"]["prompt_tokens"],
            "total_tokens": final["usage"]["prompt_tokens"] + expected,
            "completion_tokens": expected,
            "completion_tokens_details": None,
        }
        assert list(c)[list(c).index("choices") + 1] == "usage"  # where vLLM 0.32 puts it
    assert running == {0: 4, 1: 4}
    assert final["choices"] == []
    assert final["usage"]["completion_tokens"] == 8
    # Without the option (or without include_usage) no chunk but the final one carries usage.
    for opts in ({"include_usage": True}, {"continuous_usage_stats": True}):
        plain = _body(max_tokens=4, ignore_eos=True, stream=True, stream_options=opts)
        async with aiohttp.ClientSession() as s, s.post(f"{sim.url}/v1/chat/completions", json=plain) as resp:
            got = [json.loads(e) for e in (await _events(resp))[:-1]]
        assert all("usage" not in c for c in got if c["choices"])


async def test_openai_sdk_streams_with_usage(sim: RunningEngine) -> None:
    client = openai.AsyncOpenAI(base_url=f"{sim.url}/v1", api_key="unused")
    try:
        stream = await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=7,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage is not None:
                usage = chunk.usage
        assert text
        assert usage is not None
        assert usage.completion_tokens == 7
        assert usage.prompt_tokens == 8
    finally:
        await client.close()


async def test_tokenize_chat_form_and_metrics_names(sim: RunningEngine) -> None:
    async with aiohttp.ClientSession() as s:
        body = await (
            await s.post(f"{sim.url}/tokenize", json={"messages": [{"role": "user", "content": "a b c"}]})
        ).json()
        assert body["count"] == 10
        text = await (await s.get(f"{sim.url}/metrics")).text()
    for name in ("vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", 'finished_reason="abort"'):
        assert name in text


async def test_waiting_queue_and_preemption_show_in_metrics() -> None:
    settings = EngineSimSettings(
        model="tiny", port=0, speed=5, max_num_seqs=2, num_blocks=65, max_model_len=1024
    )
    running = await start_enginesim(settings)
    try:
        async with aiohttp.ClientSession() as s:

            async def one() -> int:
                # 2 x (8 + 600) tokens need 76 blocks of the 64 usable: the second one gets preempted.
                r = await s.post(
                    f"{running.url}/v1/chat/completions", json=_body(max_tokens=600, ignore_eos=True)
                )
                return len(json.loads(await r.read())["choices"])

            m = running.state.metrics
            tasks = [asyncio.create_task(one()) for _ in range(4)]
            await _poll(lambda: m.waiting._value.get() >= 2)
            assert await asyncio.gather(*tasks) == [1, 1, 1, 1]
        assert m.preemptions._value.get() > 0
    finally:
        await running.close()


async def test_unknown_profile_is_a_clear_error() -> None:
    with pytest.raises(SpecError, match="known profiles"):
        await start_enginesim(EngineSimSettings(model="tiny", profile="gpt-9", port=0))


async def test_error_after_tokens_sends_vllm_error_event_then_done(sim: RunningEngine) -> None:
    sim.set_faults(Faults(error_after_tokens=2, fail_message="engine died"))
    async with aiohttp.ClientSession() as s:
        resp = await s.post(
            f"{sim.url}/v1/chat/completions", json=_body(max_tokens=20, ignore_eos=True, stream=True)
        )
        assert resp.status == 200
        events = await _events(resp)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error == {"message": "engine died", "type": "InternalServerError", "param": None, "code": 500}
    content = [e for e in events[:-2] if '"role"' not in e]
    assert len(content) == 2
    sched = sim.state.engine.scheduler
    await _poll(lambda: not sched.has_work())


def test_cli_unknown_profile_exits_2_listing_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    from apps.cli.main import main

    assert main(["enginesim", "--model", "x", "--profile", "nope", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "known profiles: " in err
    assert "llama-3.1-8b-instruct" in err
    assert "tiny" in err


@pytest.mark.parametrize("content", [5, {"a": 1}, [5], True])
async def test_a_content_that_is_not_text_or_parts_is_a_400_not_a_crash(
    sim: RunningEngine, content: object
) -> None:
    """A number as `content` crashed the chat template (500, "Server got itself in trouble"); vLLM's
    request model refuses it with a 400."""
    async with aiohttp.ClientSession() as s:
        body = {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 2}
        async with s.post(f"{sim.url}/v1/chat/completions", json=body) as r:
            assert r.status == 400
            error = (await r.json())["error"]
            assert error["type"] == "Bad Request"
            assert error["param"].startswith("body.messages.0.content")
        async with s.post(f"{sim.url}/v1/chat/completions", json=_body(max_tokens=2)) as ok:
            assert ok.status == 200  # and the engine serves the next request
