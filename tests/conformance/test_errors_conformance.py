"""Error envelopes and statuses, context-length rules (vLLM 0.32: reject or clamp)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conformance.conftest import EngineUnderTest
from tests.conformance.helpers import chat_body


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60.0) as c:
        yield c


def _error(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == status
    assert isinstance(body["error"]["message"], str)
    assert body["error"]["message"]
    err: dict[str, Any] = body["error"]
    return err


def test_unknown_model_is_404(engine: EngineUnderTest, client: httpx.Client) -> None:
    err = _error(client.post(f"{engine.url}/v1/chat/completions", json=chat_body("nope")), 404)
    assert err["type"] == "NotFoundError"
    assert err["param"] == "model"
    assert "`nope` does not exist" in err["message"]


def test_missing_messages_is_400(engine: EngineUnderTest, client: httpx.Client) -> None:
    err = _error(client.post(f"{engine.url}/v1/chat/completions", json={"model": engine.model}), 400)
    assert err["type"] == "Bad Request"
    assert err["param"] == "body.messages"


def test_not_json_is_400(engine: EngineUnderTest, client: httpx.Client) -> None:
    resp = client.post(
        f"{engine.url}/v1/chat/completions", content=b"not json", headers={"content-type": "application/json"}
    )
    err = _error(resp, 400)
    assert err["type"] == "Bad Request"


def test_wrong_type_is_400(engine: EngineUnderTest, client: httpx.Client) -> None:
    err = _error(
        client.post(f"{engine.url}/v1/chat/completions", json=chat_body(engine.model, max_tokens="x")), 400
    )
    assert err["param"] == "body.max_tokens"


def test_stream_options_without_stream_is_400(engine: EngineUnderTest, client: httpx.Client) -> None:
    body = chat_body(engine.model, stream_options={"include_usage": True})
    err = _error(client.post(f"{engine.url}/v1/chat/completions", json=body), 400)
    assert err["type"] == "BadRequestError"
    assert err["param"] == "stream_options"


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_longer_than_context_is_400_json(
    engine: EngineUnderTest, client: httpx.Client, stream: bool
) -> None:
    body = chat_body(engine.model, content="hello " * (engine.max_model_len + 200), stream=stream)
    err = _error(client.post(f"{engine.url}/v1/chat/completions", json=body), 400)
    assert err["type"] == "BadRequestError"
    assert err["param"] == "input_tokens"
    assert f"maximum context length is {engine.max_model_len} tokens" in err["message"]


def test_max_tokens_above_context_is_400(engine: EngineUnderTest, client: httpx.Client) -> None:
    body = chat_body(engine.model, max_tokens=5000)
    err = _error(client.post(f"{engine.url}/v1/chat/completions", json=body), 400)
    assert err["param"] == "max_tokens"
    assert f"max_model_len={engine.max_model_len}" in err["message"]


def test_max_tokens_zero_is_400(engine: EngineUnderTest, client: httpx.Client) -> None:
    err = _error(
        client.post(f"{engine.url}/v1/chat/completions", json=chat_body(engine.model, max_tokens=0)), 400
    )
    assert err["param"] == "max_tokens"


def test_prompt_plus_max_tokens_over_context_is_clamped(
    engine: EngineUnderTest, client: httpx.Client
) -> None:
    content = "hello world " * 100
    messages = [{"role": "user", "content": content}]
    count = client.post(f"{engine.url}/tokenize", json={"model": engine.model, "messages": messages}).json()[
        "count"
    ]
    assert 100 < count < engine.max_model_len - 50
    room = engine.max_model_len - count
    body = {"model": engine.model, "messages": messages, "max_tokens": room + 40, "ignore_eos": True}
    resp = client.post(f"{engine.url}/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["prompt_tokens"] == count
    assert out["usage"]["completion_tokens"] == room
    assert out["usage"]["total_tokens"] == engine.max_model_len
