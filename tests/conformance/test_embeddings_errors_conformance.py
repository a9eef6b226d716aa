"""Embeddings' errors on both pooling engines: status, error type, `param` and message, as measured on
vLLM 0.32 (`docs/enginesim.md`, "Legacy completions and embeddings"). vLLM lists the validation
errors of each of its five embedding request models; enginesim lists those of the text-input one
only, so a validation message is compared by its first error (`differences.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conformance.conftest import HIDDEN_SIZE, EngineUnderTest
from tests.conformance.helpers import error_of

PATH = "/v1/embeddings"


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60.0) as c:
        yield c


def _post(engine: EngineUnderTest, client: httpx.Client, **body: Any) -> httpx.Response:
    return client.post(f"{engine.url}{PATH}", json={"model": engine.model, **body})


@pytest.mark.parametrize("dimensions", [64, HIDDEN_SIZE])
def test_dimensions_are_refused_for_a_model_without_matryoshka(
    pooling_engine: EngineUnderTest, client: httpx.Client, dimensions: int
) -> None:
    err = error_of(_post(pooling_engine, client, input="hello", dimensions=dimensions), 400)
    assert (err["type"], err["param"]) == ("BadRequestError", None)
    assert err["message"] == (
        f"Model '{pooling_engine.model}' does not support Matryoshka embeddings; dimensions must be unset "
        f"(received dimensions={dimensions})."
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], "You must pass at least one prompt"),
        ("", "The decoder prompt cannot be empty"),
        ([[]], "The decoder prompt cannot be empty"),
        (["a", ""], "The decoder prompt cannot be empty"),
        ([-1], "Token id -1 is out of vocabulary"),
        ([5000], "Token id 5000 is out of vocabulary"),
    ],
    ids=["empty-list", "empty-text", "empty-ids", "empty-text-in-list", "negative-id", "out-of-vocab"],
)
def test_empty_and_out_of_vocabulary_inputs_are_400(
    pooling_engine: EngineUnderTest, client: httpx.Client, value: object, message: str
) -> None:
    err = error_of(_post(pooling_engine, client, input=value), 400)
    assert (err["type"], err["param"], err["message"]) == ("BadRequestError", None, message)


@pytest.mark.parametrize(
    ("body", "param", "first_error"),
    [
        (
            {},
            "body.input",
            "{'type': 'missing', 'loc': 'body.input', 'msg': 'Field required', 'input': '<dict of 1 items>'}",
        ),
        (
            {"input": 123},
            "body.input",
            "{'type': 'list_type', 'loc': 'body.input', 'msg': 'Input should be a valid list', 'input': '123'}",
        ),
        (
            {"input": ["a", 1]},
            "body.input.0",
            "{'type': 'int_parsing', 'loc': 'body.input.0', 'msg': 'Input should be a valid integer, unable to "
            "parse string as an integer', 'input': 'a'}",
        ),
        (
            {"input": "hi", "encoding_format": "xyz"},
            "body.encoding_format",
            "{'type': 'literal_error', 'loc': 'body.encoding_format', 'msg': \"Input should be 'float', 'base64', "
            "'bytes' or 'bytes_only'\", 'input': 'xyz', 'ctx': {'expected': \"'float', 'base64', 'bytes' or "
            "'bytes_only'\"}}",
        ),
    ],
    ids=["missing", "number", "mixed-list", "encoding"],
)
def test_wrong_types_are_validation_errors(
    pooling_engine: EngineUnderTest, client: httpx.Client, body: dict[str, Any], param: str, first_error: str
) -> None:
    err = error_of(_post(pooling_engine, client, **body), 400)
    assert (err["type"], err["param"]) == ("Bad Request", param)
    assert err["message"].split("\n")[1] == f"  {first_error}"


def test_an_input_longer_than_the_context_is_400(
    pooling_engine: EngineUnderTest, client: httpx.Client
) -> None:
    limit = pooling_engine.max_model_len
    text = error_of(_post(pooling_engine, client, input="hello " * (limit + 200)), 400)
    assert (text["type"], text["param"]) == ("BadRequestError", "input_tokens")
    assert f"your prompt contains at least {limit + 1} input tokens" in text["message"]
    ids = error_of(_post(pooling_engine, client, input=[5] * (limit + 52)), 400)
    assert f"your prompt contains {limit + 52} input tokens" in ids["message"]
    assert ids["message"].endswith(f"(parameter=input_tokens, value={limit + 52})")


def test_truncation_keeps_the_first_tokens(pooling_engine: EngineUnderTest, client: httpx.Client) -> None:
    limit = pooling_engine.max_model_len
    cut = _post(pooling_engine, client, input=[5] * (limit + 100), truncate_prompt_tokens=10)
    assert cut.status_code == 200, cut.text
    assert cut.json()["usage"]["prompt_tokens"] == 10
    whole = _post(pooling_engine, client, input=[5] * (limit + 100), truncate_prompt_tokens=-1)
    assert whole.json()["usage"]["prompt_tokens"] == limit
    err = error_of(_post(pooling_engine, client, input="hi", truncate_prompt_tokens=limit + 1), 400)
    assert err["message"] == (
        "truncate_prompt_tokens value is greater than max_model_len. Please request a smaller truncation size."
    )


def test_an_unknown_model_is_404_without_aliases(
    pooling_engine: EngineUnderTest, client: httpx.Client
) -> None:
    err = error_of(client.post(f"{pooling_engine.url}{PATH}", json={"model": "nope", "input": []}), 404)
    assert err == {
        "message": "The model `nope` does not exist.",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }


def test_a_body_that_is_not_an_object_is_400(pooling_engine: EngineUnderTest, client: httpx.Client) -> None:
    resp = client.post(
        f"{pooling_engine.url}{PATH}", content=b"[1,2]", headers={"content-type": "application/json"}
    )
    err = error_of(resp, 400)
    assert (err["type"], err["param"]) == ("Bad Request", "body")
    assert err["message"].startswith("5 validation errors:")  # once per request model of vLLM's
