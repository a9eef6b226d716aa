"""enginesim's legacy completions: the plan (prompts, `n`, token counts, vLLM's defaults and
errors), the chunk and body shapes, and the endpoint in-process (the shared engine machinery:
metrics, faults, the timing-free abort on disconnect)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from apps.enginesim.completion_bodies import CompletionFormat, completion_body
from apps.enginesim.completions import CompletionJob, plan_completion
from apps.enginesim.errors import VllmError
from apps.enginesim.faults import Faults
from apps.enginesim.server import RunningEngine, start_enginesim
from apps.enginesim.settings import EngineSimSettings

pytestmark = pytest.mark.timeout(60)


def _plan(body: object, *, max_model_len: int = 64) -> CompletionJob:
    return plan_completion(
        body, served_model="tiny", max_model_len=max_model_len, mean_answer_tokens=8, server_seed=0
    )


def _error(body: object, max_model_len: int = 64) -> VllmError:
    with pytest.raises(VllmError) as err:
        _plan(body, max_model_len=max_model_len)
    return err.value


def _event(raw: bytes) -> dict[str, object]:
    assert raw.startswith(b"data: ")
    assert raw.endswith(b"\n\n")
    out: dict[str, object] = json.loads(raw[6:])
    return out


# -- the plan ---------------------------------------------------------------------------------


def test_max_tokens_defaults_to_16_as_vllm() -> None:
    for body in (
        {"prompt": "hi", "ignore_eos": True},
        {"prompt": "hi", "ignore_eos": True, "max_tokens": None},
    ):
        assert [c.target_tokens for c in _plan(body).choices] == [16]


def test_prompts_and_n_make_prompt_major_choices() -> None:
    job = _plan({"prompt": ["hello world", "a, b"], "n": 2, "max_tokens": 3, "ignore_eos": True})
    assert [c.index for c in job.choices] == [0, 1, 2, 3]
    assert [tokens for tokens, _ in job.prompts] == [2, 3]  # words and punctuation, no BOS
    assert job.prompt_tokens == 5  # each prompt once, whatever n
    assert [job.prompt_of(c)[0] for c in job.choices] == [2, 2, 3, 3]
    assert job.request_id.startswith("cmpl-")
    ids = _plan({"prompt": [[5, 6, 7, 8], [9]], "max_tokens": 1})
    assert ids.prompts == [(4, (5, 6, 7, 8)), (1, (9,))]  # token ids as given


def test_one_token_list_is_one_prompt_and_a_list_of_them_several() -> None:
    assert len(_plan({"prompt": [1, 2, 3], "max_tokens": 1}).prompts) == 1
    assert len(_plan({"prompt": [[1, 2], [3]], "max_tokens": 1}).prompts) == 2
    # The tiny model's tokenizer adds no BOS, whatever `add_special_tokens` says (measured).
    assert _plan({"prompt": "hello", "max_tokens": 1}).prompt_tokens == 1
    assert _plan({"prompt": "hello", "add_special_tokens": False, "max_tokens": 1}).prompt_tokens == 1


def test_the_same_request_gives_the_same_text() -> None:
    body = {"prompt": "hello world", "max_tokens": 6, "seed": 3}
    first, second = _plan(body), _plan(body)
    assert first.choices[0].words == second.choices[0].words
    assert _plan({**body, "seed": 4}).choices[0].words != first.choices[0].words


def test_prompt_plus_max_tokens_beyond_the_context_is_clamped() -> None:
    job = _plan({"prompt": [5] * 60, "max_tokens": 50, "ignore_eos": True})
    assert job.choices[0].target_tokens == 4
    assert job.choices[0].finish_reason == "length"


def test_stop_strings_cut_the_text() -> None:
    free = _plan({"prompt": "hello", "max_tokens": 20, "ignore_eos": True, "seed": 1}).choices[0]
    stop = free.words[3].strip()
    cut = _plan({"prompt": "hello", "max_tokens": 20, "ignore_eos": True, "seed": 1, "stop": stop}).choices[0]
    assert (cut.finish_reason, cut.stop_reason) == ("stop", stop)
    assert stop not in "".join(cut.words)


@pytest.mark.parametrize(
    ("body", "status", "type_", "param", "gist"),
    [
        ({"prompt": ""}, 400, "BadRequestError", "prompt", "Either prompt or prompt_embeds"),
        ({}, 400, "BadRequestError", "prompt", "Either prompt or prompt_embeds"),
        ({"model": "nope"}, 400, "BadRequestError", "prompt", "Either prompt"),  # before the model
        ({"model": "nope", "prompt": "x"}, 404, "NotFoundError", "model", "`nope` does not exist"),
        ({"prompt": 123}, 400, "Bad Request", "body.prompt", "validation error"),
        ({"prompt": "x", "max_tokens": "y"}, 400, "Bad Request", "body.max_tokens", "validation error"),
        ({"prompt": "x", "max_tokens": 65}, 400, "BadRequestError", "max_tokens", "cannot be greater than"),
        ({"prompt": "x", "max_tokens": 0}, 400, "BadRequestError", "max_tokens", "at least 1, got 0"),
        ({"prompt": [5] * 70}, 400, "BadRequestError", "input_tokens", "contains 70 input tokens"),
        ({"prompt": "w " * 100}, 400, "BadRequestError", "input_tokens", "contains at least 65 input tokens"),
        (
            {"prompt": "x", "stream_options": {"include_usage": True}},
            400,
            "BadRequestError",
            "stream_options",
            "`stream=True`",
        ),
        ({"prompt": "x", "n": 0}, 400, "BadRequestError", None, "n must be at least 1"),
        ({"prompt": "x", "stop": [""]}, 400, "BadRequestError", None, "empty string"),
        ({"prompt": []}, 400, "BadRequestError", None, "You must pass at least one prompt"),
        ({"prompt": [], "max_tokens": 65}, 400, "BadRequestError", "max_tokens", "cannot be greater than"),
        ({"prompt": [[]]}, 400, "BadRequestError", None, "The decoder prompt cannot be empty"),
        ({"prompt": ["a", ""]}, 400, "BadRequestError", None, "The decoder prompt cannot be empty"),
        ({"prompt": [[]], "n": 0}, 400, "BadRequestError", None, "n must be at least 1"),  # sampling first
        ({"prompt": [5, 5000]}, 400, "BadRequestError", None, "Token id 5000 is out of vocabulary"),
        ({"prompt": [-1]}, 400, "Bad Request", "body.prompt.0", "greater_than_equal"),
        (
            {"prompt": ["x"] * 1025},
            400,
            "BadRequestError",
            "prompt",
            "exceeds the maximum allowed count of 1024",
        ),
    ],
)
def test_errors_as_vllm(
    body: dict[str, object], status: int, type_: str, param: str | None, gist: str
) -> None:
    err = _error(body)
    assert (err.status, err.type, err.param) == (status, type_, param)
    assert gist in err.message


def test_empty_stream_options_without_stream_are_accepted() -> None:
    assert _plan({"prompt": "x", "max_tokens": 1, "stream_options": {}}).include_usage is False


def test_a_non_zero_priority_is_accepted_as_vllm_032_does() -> None:
    # Measured: vLLM 0.32 under the default fcfs policy answers a priority-5 completion with 200.
    assert _plan({"prompt": "x", "max_tokens": 1, "priority": 5}).priority == 5


# -- the bodies -------------------------------------------------------------------------------


def test_stream_chunks_have_no_role_and_carry_text() -> None:
    job = _plan({"prompt": "hello", "max_tokens": 2, "ignore_eos": True, "stream": True})
    fmt = CompletionFormat(job)
    choice = job.choices[0]
    assert fmt.opening(choice) == b""
    first, last = _event(fmt.token(choice, 0, False, False)), _event(fmt.token(choice, 1, True, True))
    assert (first["object"], first["id"]) == ("text_completion", job.request_id)
    assert first["choices"] == [
        {
            "index": 0,
            "text": choice.words[0],
            "logprobs": None,
            "finish_reason": None,
            "stop_reason": None,
            "prompt_token_ids": None,
            "token_ids": None,
        }
    ]
    assert "usage" not in first
    assert "system_fingerprint" not in first
    assert last["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
    assert "system_fingerprint" in last
    assert fmt.tail() == b""


def test_usage_chunk_and_continuous_usage() -> None:
    job = _plan(
        {
            "prompt": ["hello", "a b c"],
            "max_tokens": 2,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
    )
    fmt = CompletionFormat(job)
    second_prompt = job.choices[1]
    chunk = _event(fmt.token(second_prompt, 0, False, False))
    assert chunk["usage"] == {"prompt_tokens": 3, "total_tokens": 4, "completion_tokens": 1}
    assert "system_fingerprint" not in _event(
        fmt.token(second_prompt, 1, True, False)
    )  # a usage chunk follows
    tail = _event(fmt.tail())
    assert tail["choices"] == []
    assert tail["usage"] == {"prompt_tokens": 4, "total_tokens": 8, "completion_tokens": 4}


def test_the_non_streamed_body() -> None:
    job = _plan({"prompt": ["hello", "a b c"], "max_tokens": 2, "ignore_eos": True})
    body = completion_body(job)
    assert body["object"] == "text_completion"
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert all(c["text"] == "".join(job.choices[i].words) for i, c in enumerate(body["choices"]))
    assert (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"]) == (4, 4)
    assert body["usage"]["prompt_tokens_details"] is None  # without --enable-prompt-tokens-details


# -- the endpoint in-process ------------------------------------------------------------------


@pytest.fixture
async def sim() -> AsyncIterator[RunningEngine]:
    running = await start_enginesim(EngineSimSettings(model="tiny", port=0, speed=50))
    try:
        yield running
    finally:
        await running.close()


async def _events(resp: aiohttp.ClientResponse) -> list[str]:
    out = []
    async for line in resp.content:
        text = line.decode().strip()
        if text.startswith("data: "):
            out.append(text[6:])
    return out


async def test_a_streamed_completion_through_the_engine(sim: RunningEngine) -> None:
    body = {
        "model": "tiny",
        "prompt": [5, 6, 7],
        "max_tokens": 4,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with aiohttp.ClientSession() as s, s.post(f"{sim.url}/v1/completions", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = await _events(resp)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) == 5  # one per token, then usage
    assert chunks[-1]["usage"] == {"prompt_tokens": 3, "total_tokens": 7, "completion_tokens": 4}
    m = sim.state.metrics
    assert m.prompt_tokens._value.get() == 3
    assert m.generation_tokens._value.get() == 4


async def test_faults_hit_completions_too(sim: RunningEngine) -> None:
    sim.set_faults(Faults(die_after_tokens=2))
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 50, "ignore_eos": True, "stream": True}
    async with aiohttp.ClientSession() as s, s.post(f"{sim.url}/v1/completions", json=body) as resp:
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await _events(resp)
    sim.set_faults(Faults(error_after_tokens=1))
    async with aiohttp.ClientSession() as s, s.post(f"{sim.url}/v1/completions", json=body) as resp:
        events = await _events(resp)
    assert json.loads(events[-2])["error"]["code"] == 500
    assert events[-1] == "[DONE]"


async def test_an_engine_refusal_reaches_a_stream_as_an_error_event(sim: RunningEngine) -> None:
    body = {"model": "tiny", "prompt": ["hello", ""], "max_tokens": 2, "stream": True}
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{sim.url}/v1/completions", json=body) as resp:
            assert resp.status == 200  # vLLM's input processor runs after the stream has started
            events = await _events(resp)
        assert events[-1] == "[DONE]"
        assert json.loads(events[0]) == {
            "error": {
                "message": "The decoder prompt cannot be empty",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        }
        async with s.post(f"{sim.url}/v1/completions", json={**body, "stream": False}) as resp:
            assert resp.status == 400
    assert sim.state.engine.in_flight == 0
