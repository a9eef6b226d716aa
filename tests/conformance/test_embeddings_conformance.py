"""Embeddings (`POST /v1/embeddings`) on both pooling engines: the official SDK (its default base64
and explicit floats), the body's shape, vectors (length, unit norm, determinism), usage, inputs as
text, lists and token ids, metrics, and the generating endpoints a pooling engine refuses.

vLLM serves the tiny Llama with `--runner pooling --convert embed`; enginesim `--runner pooling
--embedding-dim 128` (`conftest.py`). The vectors' values differ (random weights against enginesim's
hashed words); only enginesim promises that texts sharing words are close (`differences.py`).
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.conformance.conftest import HIDDEN_SIZE, EngineUnderTest
from tests.conformance.helpers import metric, metric_values, tokens_of

PATH = "/v1/embeddings"


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60.0) as c:
        yield c


@pytest.fixture
def sdk(pooling_engine: EngineUnderTest) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=pooling_engine.url + "/v1", api_key="x", max_retries=0, timeout=60.0) as c:
        yield c


def _norm(vec: list[float]) -> float:
    return math.sqrt(sum(v * v for v in vec))


def _float32(vec: list[float]) -> list[float]:
    return list(struct.unpack(f"<{len(vec)}f", struct.pack(f"<{len(vec)}f", *vec)))


def test_sdk_default_base64_and_float_agree(pooling_engine: EngineUnderTest, sdk: openai.OpenAI) -> None:
    default = sdk.embeddings.create(model=pooling_engine.model, input="hello world")  # the SDK asks base64
    floats = sdk.embeddings.create(model=pooling_engine.model, input="hello world", encoding_format="float")
    for out in (default, floats):
        assert out.object == "list"
        assert out.model == pooling_engine.model
        assert len(out.data) == 1
        assert out.data[0].object == "embedding"
        assert out.data[0].index == 0
        assert len(out.data[0].embedding) == HIDDEN_SIZE
        assert abs(_norm(out.data[0].embedding) - 1.0) < 1e-3
    assert default.data[0].embedding == _float32(floats.data[0].embedding)
    assert default.usage.prompt_tokens == floats.usage.prompt_tokens == floats.usage.total_tokens


def test_raw_body_and_base64_bytes(pooling_engine: EngineUnderTest, client: httpx.Client) -> None:
    url = f"{pooling_engine.url}{PATH}"
    as_float = client.post(url, json={"model": pooling_engine.model, "input": "hello world"})
    as_b64 = client.post(
        url, json={"model": pooling_engine.model, "input": "hello world", "encoding_format": "base64"}
    )
    assert as_float.status_code == as_b64.status_code == 200
    body = as_float.json()
    assert body["id"].startswith("embd-")
    assert isinstance(body["created"], int)
    assert list(body) == ["id", "object", "created", "model", "data", "usage"]
    assert list(body["data"][0]) == ["index", "object", "embedding"]
    count = tokens_of(client, pooling_engine.url, pooling_engine.model, "hello world")
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == count
    raw = base64.b64decode(as_b64.json()["data"][0]["embedding"])
    assert len(raw) == 4 * HIDDEN_SIZE  # float32
    assert list(struct.unpack(f"<{HIDDEN_SIZE}f", raw)) == _float32(body["data"][0]["embedding"])


def test_the_same_input_gives_the_same_vector(pooling_engine: EngineUnderTest, sdk: openai.OpenAI) -> None:
    texts = ["hello world", "hello world", "an entirely different sentence about rivers"]
    out = sdk.embeddings.create(model=pooling_engine.model, input=texts, encoding_format="float")
    assert [d.index for d in out.data] == [0, 1, 2]
    again = sdk.embeddings.create(model=pooling_engine.model, input="hello world", encoding_format="float")
    assert out.data[0].embedding == out.data[1].embedding == again.data[0].embedding
    assert out.data[0].embedding != out.data[2].embedding


def test_texts_sharing_words_are_closer_on_enginesim(
    pooling_engine: EngineUnderTest, sdk: openai.OpenAI
) -> None:
    texts = [
        "the quick brown fox jumps over the lazy dog",
        "the quick brown fox jumped over the lazy dog",
        "quarterly tax filing deadline",
    ]
    out = sdk.embeddings.create(model=pooling_engine.model, input=texts, encoding_format="float")
    a, b, c = (d.embedding for d in out.data)
    assert all(abs(_norm(v) - 1.0) < 1e-3 for v in (a, b, c))
    if pooling_engine.traits.semantic_embeddings:
        close = sum(x * y for x, y in zip(a, b, strict=True))
        far = sum(x * y for x, y in zip(a, c, strict=True))
        assert close > far + 0.3


@pytest.mark.parametrize(
    ("inputs", "tokens"),
    [([1, 300, 400], [3]), ([[300, 400], [500, 600, 700]], [2, 3])],
    ids=["token-ids", "token-id-lists"],
)
def test_token_id_inputs_are_counted_as_given(
    pooling_engine: EngineUnderTest,
    client: httpx.Client,
    inputs: list[int] | list[list[int]],
    tokens: list[int],
) -> None:
    resp = client.post(f"{pooling_engine.url}{PATH}", json={"model": pooling_engine.model, "input": inputs})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert [d["index"] for d in body["data"]] == list(range(len(tokens)))
    assert all(len(d["embedding"]) == HIDDEN_SIZE for d in body["data"])
    assert body["usage"]["prompt_tokens"] == sum(tokens)


def test_a_list_of_texts_is_counted_text_by_text(
    pooling_engine: EngineUnderTest, client: httpx.Client
) -> None:
    texts = ["hello world", "good morning to you all"]
    resp = client.post(f"{pooling_engine.url}{PATH}", json={"model": pooling_engine.model, "input": texts})
    assert resp.status_code == 200, resp.text
    expected = sum(tokens_of(client, pooling_engine.url, pooling_engine.model, t) for t in texts)
    assert resp.json()["usage"] == {
        "prompt_tokens": expected,
        "total_tokens": expected,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def test_metrics_count_the_prompt_tokens(pooling_engine: EngineUnderTest, client: httpx.Client) -> None:
    before = metric_values(client, pooling_engine.url)
    body = {"model": pooling_engine.model, "input": [[11, 12, 13, 14], [15, 16]]}
    assert client.post(f"{pooling_engine.url}{PATH}", json=body).status_code == 200
    after = metric_values(client, pooling_engine.url)

    def moved(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert moved("vllm:prompt_tokens_total") == 6
    assert moved("vllm:generation_tokens_total") == 0
    assert moved("vllm:request_success_total", finished_reason="stop") == 2
    assert metric(after, "vllm:num_requests_running") == 0
    assert metric(after, "vllm:num_requests_waiting") == 0


def test_a_pooling_engine_serves_health_models_and_tokenize(
    pooling_engine: EngineUnderTest, client: httpx.Client
) -> None:
    assert client.get(f"{pooling_engine.url}/health").status_code == 200
    card = client.get(f"{pooling_engine.url}/v1/models").json()["data"][0]
    assert card["id"] == pooling_engine.model
    assert tokens_of(client, pooling_engine.url, pooling_engine.model, "hello world") > 0


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
    ],
    ids=["chat", "completions"],
)
def test_a_pooling_engine_refuses_generation(
    pooling_engine: EngineUnderTest, client: httpx.Client, path: str, body: dict[str, object]
) -> None:
    resp = client.post(f"{pooling_engine.url}{path}", json={"model": pooling_engine.model, **body})
    assert resp.status_code == 404
    assert resp.json() == {"detail": "Not Found"}  # the router's answer: the route does not exist
