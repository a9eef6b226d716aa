"""Legacy completions' errors on both engines: status, error type, `param` and the message's gist,
as measured on vLLM 0.32 (`docs/enginesim.md`, "Legacy completions and embeddings")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conformance.conftest import EngineUnderTest
from tests.conformance.helpers import error_of, stream_sse

PATH = "/v1/completions"


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60.0) as c:
        yield c


def _post(engine: EngineUnderTest, client: httpx.Client, **body: Any) -> httpx.Response:
    return client.post(f"{engine.url}{PATH}", json={"model": engine.model, **body})


@pytest.mark.parametrize("body", [{"prompt": ""}, {}], ids=["empty-string", "missing"])
def test_an_empty_or_missing_prompt_is_400(
    engine: EngineUnderTest, client: httpx.Client, body: dict[str, Any]
) -> None:
    err = error_of(_post(engine, client, **body), 400)
    assert err["type"] == "BadRequestError"
    assert err["param"] == "prompt"
    assert "Either prompt or prompt_embeds must be provided and non-empty." in err["message"]


def test_a_missing_prompt_is_checked_before_the_model(engine: EngineUnderTest, client: httpx.Client) -> None:
    err = error_of(client.post(f"{engine.url}{PATH}", json={"model": "nope"}), 400)
    assert err["param"] == "prompt"


WRONG_TYPES = {
    "number": (
        123,
        "body.prompt",
        "4 validation errors:\n  {'type': 'list_type', 'loc': 'body.prompt', 'msg': 'Input should be a valid list', "
        "'input': '123'}",
    ),
    "mixed-list": (
        ["a", 1],
        "body.prompt.0",
        "5 validation errors:\n  {'type': 'int_parsing', 'loc': 'body.prompt.0', 'msg': 'Input should be a valid "
        "integer, unable to parse string as an integer', 'input': 'a'}",
    ),
    "negative-id": (
        [-1, 5],
        "body.prompt.0",
        "6 validation errors:\n  {'type': 'greater_than_equal', 'loc': 'body.prompt.0', 'msg': 'Input should be "
        "greater than or equal to 0', 'input': '-1', 'ctx': {'ge': 0}}",
    ),
}


@pytest.mark.parametrize("case", list(WRONG_TYPES))
def test_a_wrongly_typed_prompt_is_a_validation_error(
    engine: EngineUnderTest, client: httpx.Client, case: str
) -> None:
    prompt, param, first_lines = WRONG_TYPES[case]
    err = error_of(_post(engine, client, prompt=prompt), 400)
    assert (err["type"], err["param"]) == ("Bad Request", param)
    assert err["message"].startswith(first_lines)


def test_unknown_model_is_404(engine: EngineUnderTest, client: httpx.Client) -> None:
    err = error_of(client.post(f"{engine.url}{PATH}", json={"model": "nope", "prompt": "hi"}), 404)
    assert err["type"] == "NotFoundError"
    assert err["param"] == "model"
    assert "`nope` does not exist" in err["message"]


def test_not_json_is_400(engine: EngineUnderTest, client: httpx.Client) -> None:
    resp = client.post(
        f"{engine.url}{PATH}", content=b"not json", headers={"content-type": "application/json"}
    )
    assert error_of(resp, 400)["type"] == "Bad Request"


@pytest.mark.parametrize("stream", [False, True])
def test_a_text_prompt_longer_than_the_context_is_400(
    engine: EngineUnderTest, client: httpx.Client, stream: bool
) -> None:
    err = error_of(_post(engine, client, prompt="hello " * (engine.max_model_len + 200), stream=stream), 400)
    assert err["type"] == "BadRequestError"
    assert err["param"] == "input_tokens"
    assert f"maximum context length is {engine.max_model_len} tokens" in err["message"]


def test_a_token_prompt_longer_than_the_context_names_its_length(
    engine: EngineUnderTest, client: httpx.Client
) -> None:
    count = engine.max_model_len + 52
    err = error_of(_post(engine, client, prompt=[5] * count), 400)
    assert err["param"] == "input_tokens"
    assert f"your prompt contains {count} input tokens" in err["message"]


def test_max_tokens_above_the_context_is_400(engine: EngineUnderTest, client: httpx.Client) -> None:
    err = error_of(_post(engine, client, prompt="hi", max_tokens=5000), 400)
    assert err["param"] == "max_tokens"
    assert f"max_tokens=5000 cannot be greater than max_model_len={engine.max_model_len}" in err["message"]


@pytest.mark.parametrize("max_tokens", [0, -1])
def test_max_tokens_below_one_is_400(engine: EngineUnderTest, client: httpx.Client, max_tokens: int) -> None:
    err = error_of(_post(engine, client, prompt="hi", max_tokens=max_tokens), 400)
    assert err["param"] == "max_tokens"
    assert f"max_tokens must be at least 1, got {max_tokens}." in err["message"]


def test_stream_options_without_stream_is_400(engine: EngineUnderTest, client: httpx.Client) -> None:
    err = error_of(_post(engine, client, prompt="hi", stream_options={"include_usage": True}), 400)
    assert err["type"] == "BadRequestError"
    assert err["param"] == "stream_options"


def test_no_prompt_at_all_is_400(engine: EngineUnderTest, client: httpx.Client) -> None:
    err = error_of(_post(engine, client, prompt=[]), 400)
    assert (err["type"], err["param"], err["message"]) == (
        "BadRequestError",
        None,
        "You must pass at least one prompt",
    )


def test_n_below_one_is_400_without_param(engine: EngineUnderTest, client: httpx.Client) -> None:
    err = error_of(_post(engine, client, prompt="hi", n=0), 400)
    assert (err["type"], err["param"], err["message"]) == (
        "BadRequestError",
        None,
        "n must be at least 1, got 0.",
    )


ENGINE_REFUSALS = [
    ([[]], "The decoder prompt cannot be empty"),
    (["hello", ""], "The decoder prompt cannot be empty"),
    ([5, 5000], "Token id 5000 is out of vocabulary"),
]


@pytest.mark.parametrize(
    ("prompt", "message"), ENGINE_REFUSALS, ids=["empty-ids", "empty-text", "out-of-vocab"]
)
def test_the_engines_input_checks_are_400(
    engine: EngineUnderTest, client: httpx.Client, prompt: object, message: str
) -> None:
    err = error_of(_post(engine, client, prompt=prompt, max_tokens=2), 400)
    assert (err["type"], err["param"], err["message"]) == ("BadRequestError", None, message)


@pytest.mark.parametrize(
    ("prompt", "message"), ENGINE_REFUSALS, ids=["empty-ids", "empty-text", "out-of-vocab"]
)
def test_the_engines_input_checks_reach_a_stream_as_an_error_event(
    engine: EngineUnderTest, client: httpx.Client, prompt: object, message: str
) -> None:
    # vLLM's input processor runs once the stream has started: 200, the error event, [DONE].
    body = {"model": engine.model, "prompt": prompt, "max_tokens": 2, "stream": True}
    res = stream_sse(client, engine.url, PATH, body)
    assert res.status == 200
    assert res.payloads[-1] == "[DONE]"
    assert json.loads(res.payloads[0]) == {
        "error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}
    }
    assert len(res.payloads) == 2


def test_a_generate_engine_has_no_embeddings_route(engine: EngineUnderTest, client: httpx.Client) -> None:
    resp = client.post(f"{engine.url}/v1/embeddings", json={"model": engine.model, "input": "hi"})
    assert resp.status_code == 404
    assert resp.json() == {"detail": "Not Found"}  # the router's answer, not vLLM's error envelope
    wrong_method = client.get(f"{engine.url}{PATH}")
    assert wrong_method.status_code == 405
    assert wrong_method.json() == {"detail": "Method Not Allowed"}
