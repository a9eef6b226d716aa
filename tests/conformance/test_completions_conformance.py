"""Legacy completions (`POST /v1/completions`) on both engines: the official SDK (streaming and not),
the chunk shapes, usage, prompts as text, lists and token ids, `n`, clamping, errors, metrics."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.conformance.conftest import EngineUnderTest
from tests.conformance.helpers import metric, metric_values, stream_sse, tokens_of

PATH = "/v1/completions"


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60.0) as c:
        yield c


@pytest.fixture
def sdk(engine: EngineUnderTest) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=engine.url + "/v1", api_key="x", max_retries=0, timeout=60.0) as c:
        yield c


def test_sdk_completion_shape_and_usage(
    engine: EngineUnderTest, sdk: openai.OpenAI, client: httpx.Client
) -> None:
    out = sdk.completions.create(
        model=engine.model, prompt="hello world", max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert out.object == "text_completion"
    assert out.id.startswith("cmpl-")
    assert out.model == engine.model
    assert isinstance(out.created, int)
    assert len(out.choices) == 1
    choice = out.choices[0]
    assert choice.index == 0
    assert isinstance(choice.text, str)
    assert choice.text
    assert choice.finish_reason == "length"
    assert out.usage is not None
    assert out.usage.completion_tokens == 5
    assert out.usage.prompt_tokens == tokens_of(client, engine.url, engine.model, "hello world")
    assert out.usage.total_tokens == out.usage.prompt_tokens + 5


def test_max_tokens_defaults_to_16(engine: EngineUnderTest, client: httpx.Client) -> None:
    for body in ({}, {"max_tokens": None}):
        resp = client.post(
            f"{engine.url}{PATH}", json={"model": engine.model, "prompt": "hello", "ignore_eos": True, **body}
        )
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] == 16


def test_sdk_stream_with_usage(engine: EngineUnderTest, sdk: openai.OpenAI) -> None:
    chunks = list(
        sdk.completions.create(
            model=engine.model,
            prompt="hello world",
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    usage, content = chunks[-1], chunks[:-1]
    assert {c.object for c in chunks} == {"text_completion"}
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].id.startswith("cmpl-")
    assert all(len(c.choices) == 1 and isinstance(c.choices[0].text, str) for c in content)
    assert [c.choices[0].finish_reason for c in content[:-1]] == [None] * (len(content) - 1)
    assert content[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].text for c in content)
    assert usage.choices == []
    assert usage.usage is not None
    assert usage.usage.completion_tokens == 6
    if engine.traits.one_chunk_per_token:
        assert len(content) == 6
    else:
        assert 1 <= len(content) <= 6


def test_stream_framing_without_usage(engine: EngineUnderTest, client: httpx.Client) -> None:
    for options in (None, {}, {"include_usage": False}):
        body = {"model": engine.model, "prompt": "hello", "max_tokens": 3, "ignore_eos": True, "stream": True}
        if options is not None:
            body["stream_options"] = options
        res = stream_sse(client, engine.url, PATH, body)
        assert res.status == 200
        assert res.content_type.startswith("text/event-stream")
        assert res.payloads[-1] == "[DONE]"
        chunks = res.chunks
        assert all("usage" not in c for c in chunks)
        # No role chunk (unlike chat): every chunk carries text, the last one finishes the choice.
        assert all(set(c["choices"][0]) >= {"index", "text", "finish_reason"} for c in chunks)
        assert all("delta" not in c["choices"][0] for c in chunks)
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert "system_fingerprint" in chunks[-1]  # the finishing chunk, no usage chunk following


def test_continuous_usage_with_prompts_and_n(engine: EngineUnderTest, client: httpx.Client) -> None:
    prompts = ["hello world", "good morning to you"]
    counts = [tokens_of(client, engine.url, engine.model, p) for p in prompts]
    body = {
        "model": engine.model,
        "prompt": prompts,
        "n": 2,
        "max_tokens": 3,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    res = stream_sse(client, engine.url, PATH, body)
    assert res.status == 200, res.payloads
    chunks = res.chunks
    content, final = chunks[:-1], chunks[-1]
    done: dict[int, int] = {}
    for c in content:
        index = c["choices"][0]["index"]
        assert index in range(4)  # prompt i's choices are 2i and 2i + 1
        u = c["usage"]
        assert u["prompt_tokens"] == counts[index // 2]
        assert u["completion_tokens"] > done.get(index, 0)
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
        done[index] = u["completion_tokens"]
    assert done == {0: 3, 1: 3, 2: 3, 3: 3}
    assert final["choices"] == []
    assert final["usage"]["prompt_tokens"] == sum(counts)  # each prompt once, whatever n
    assert final["usage"]["completion_tokens"] == 12


def test_prompt_list_and_n_non_streaming(engine: EngineUnderTest, client: httpx.Client) -> None:
    prompts = ["hello world", "good morning to you"]
    body = {"model": engine.model, "prompt": prompts, "n": 2, "max_tokens": 3, "ignore_eos": True}
    resp = client.post(f"{engine.url}{PATH}", json=body)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    assert all(c["finish_reason"] == "length" and c["text"] for c in out["choices"])
    counts = [tokens_of(client, engine.url, engine.model, p) for p in prompts]
    assert out["usage"]["prompt_tokens"] == sum(counts)
    assert out["usage"]["completion_tokens"] == 12


@pytest.mark.parametrize(
    ("prompt", "tokens"),
    [([1, 300, 400, 500], 4), ([[300, 400], [500, 600, 700]], 5)],
    ids=["token-ids", "token-id-lists"],
)
def test_token_id_prompts_are_counted_as_given(
    engine: EngineUnderTest, client: httpx.Client, prompt: list[int] | list[list[int]], tokens: int
) -> None:
    body = {"model": engine.model, "prompt": prompt, "max_tokens": 2, "ignore_eos": True}
    resp = client.post(f"{engine.url}{PATH}", json=body)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    prompts = len(prompt) if isinstance(prompt[0], list) else 1
    assert len(out["choices"]) == prompts
    assert out["usage"]["prompt_tokens"] == tokens
    assert out["usage"]["completion_tokens"] == 2 * prompts


def test_same_seed_same_text(engine: EngineUnderTest, client: httpx.Client) -> None:
    body = {"model": engine.model, "prompt": "hello world", "max_tokens": 8, "seed": 7, "temperature": 1.0}
    texts = [client.post(f"{engine.url}{PATH}", json=body).json()["choices"][0]["text"] for _ in range(2)]
    assert texts[0] == texts[1]
    assert texts[0]


def test_prompt_plus_max_tokens_over_context_is_clamped(
    engine: EngineUnderTest, client: httpx.Client
) -> None:
    prompt = [5] * (engine.max_model_len - 8)
    resp = client.post(
        f"{engine.url}{PATH}",
        json={"model": engine.model, "prompt": prompt, "max_tokens": 50, "ignore_eos": True},
    )
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 8
    assert out["usage"]["total_tokens"] == engine.max_model_len


def test_priority_reaches_the_engine(engine: EngineUnderTest, client: httpx.Client) -> None:
    # The suite's engines run `--scheduling-policy priority`: a non-zero priority is accepted.
    resp = client.post(
        f"{engine.url}{PATH}", json={"model": engine.model, "prompt": "hi", "max_tokens": 2, "priority": 5}
    )
    assert resp.status_code == 200, resp.text


def test_metrics_count_a_completion(engine: EngineUnderTest, client: httpx.Client) -> None:
    before = metric_values(client, engine.url)
    body = {"model": engine.model, "prompt": [7, 8, 9, 10, 11], "max_tokens": 4, "ignore_eos": True}
    assert client.post(f"{engine.url}{PATH}", json=body).status_code == 200
    after = metric_values(client, engine.url)

    def moved(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert moved("vllm:prompt_tokens_total") == 5
    assert moved("vllm:generation_tokens_total") == 4
    assert moved("vllm:request_success_total", finished_reason="length") == 1
    assert metric(after, "vllm:num_requests_running") == 0
