"""enginesim's embeddings: the vector function (deterministic, unit norm, its length, word overlap
means closeness), the request rules (token counts, vLLM's errors), the encodings, and a pooling
engine in-process (the engine's metrics, the routes each runner serves)."""

from __future__ import annotations

import base64
import struct
from collections.abc import AsyncIterator

import aiohttp
import pytest

from apps.cli.main import main
from apps.enginesim import vectors
from apps.enginesim.embeddings import EmbeddingJob, embedding_body, encode, plan_embedding
from apps.enginesim.errors import VllmError
from apps.enginesim.server import RunningEngine, start_enginesim
from apps.enginesim.settings import EngineSimSettings

pytestmark = pytest.mark.timeout(60)

FOX = "the quick brown fox jumps over the lazy dog"
FOX2 = "the quick brown fox jumped over the lazy dog"
TAX = "quarterly tax filing deadline"


def _plan(body: dict[str, object], max_model_len: int = 64) -> EmbeddingJob:
    return plan_embedding(body, served_model="tiny", max_model_len=max_model_len)


# -- the vectors ------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [1, 8, 128, 1024])
def test_a_vector_has_the_dimension_and_unit_norm(dim: int) -> None:
    vec = vectors.embed(FOX, dim)
    assert len(vec) == dim
    assert abs(sum(v * v for v in vec) - 1.0) < 1e-5
    assert vec == vectors.to_float32(vec)  # float32 values, as vLLM sends


def test_the_same_input_always_gives_the_same_vector() -> None:
    assert vectors.embed(FOX, 128) == vectors.embed(FOX, 128)
    assert vectors.embed([1, 2, 3], 128) == vectors.embed([1, 2, 3], 128)


def test_different_texts_differ_even_with_the_same_words() -> None:
    reordered = "dog lazy the over jumps fox brown quick the"
    assert sorted(vectors.features(FOX)) == sorted(vectors.features(reordered))
    assert vectors.embed(FOX, 128) != vectors.embed(reordered, 128)
    assert vectors.embed(FOX, 128) != vectors.embed(TAX, 128)
    assert vectors.embed("hello", 128) != vectors.embed([1, 2], 128)
    # Same words, other order: still very close (the text's own part is small).
    assert vectors.cosine(vectors.embed(FOX, 128), vectors.embed(reordered, 128)) > 0.9


@pytest.mark.parametrize("dim", [64, 128, 1024])
def test_texts_sharing_most_words_are_closer_than_unrelated_ones(dim: int) -> None:
    fox, fox2, tax = (vectors.embed(t, dim) for t in (FOX, FOX2, TAX))
    close, far = vectors.cosine(fox, fox2), vectors.cosine(fox, tax)
    assert close > 0.6
    assert abs(far) < 0.35
    assert close > far + 0.3


def test_case_and_punctuation_do_not_change_the_words() -> None:
    a, b = vectors.embed("Hello, World!", 128), vectors.embed("hello world", 128)
    assert a != b  # the text part differs...
    assert vectors.cosine(a, b) > 0.9  # ...the words do not


def test_a_text_without_words_still_gets_a_unit_vector() -> None:
    vec = vectors.embed("?!", 32)
    assert abs(sum(v * v for v in vec) - 1.0) < 1e-5


def test_a_dimension_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        vectors.embed("x", 0)


# -- the request ------------------------------------------------------------------------------


def _tokens(job: EmbeddingJob) -> list[int]:
    return [p.tokens for p in job.prompts]


def test_inputs_and_their_token_counts() -> None:
    job = _plan({"input": ["hello world", "a, b"]})
    assert [p.text for p in job.prompts] == ["hello world", "a, b"]
    assert _tokens(job) == [2, 3]  # words and punctuation; no BOS, as the tiny model's tokenizer
    assert _tokens(_plan({"input": "hello world", "add_special_tokens": False})) == [2]
    assert _tokens(_plan({"input": [5, 6, 7]})) == [3]
    assert _tokens(_plan({"input": [[5, 6], [7]]})) == [2, 1]
    assert job.prompt_tokens == 5
    assert job.request_id.startswith("embd-")


def _error(body: object, max_model_len: int = 64) -> VllmError:
    with pytest.raises(VllmError) as err:
        plan_embedding(body, served_model="tiny", max_model_len=max_model_len)
    return err.value


def test_dimensions_are_refused_as_for_a_model_without_matryoshka() -> None:
    err = _error({"input": "hi", "dimensions": 64})
    assert (err.status, err.type, err.param) == (400, "BadRequestError", None)
    assert "does not support Matryoshka embeddings" in err.message
    assert "(received dimensions=64)" in err.message


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input": []}, "You must pass at least one prompt"),
        ({"input": ""}, "The decoder prompt cannot be empty"),
        ({"input": ["a", ""]}, "The decoder prompt cannot be empty"),
        ({"input": [[]]}, "The decoder prompt cannot be empty"),
        ({"input": [5, -1]}, "Token id -1 is out of vocabulary"),
        ({"input": [5, 5000]}, "Token id 5000 is out of vocabulary"),
    ],
)
def test_empty_and_out_of_vocabulary_inputs_are_refused(body: dict[str, object], message: str) -> None:
    err = _error(body)
    assert (err.status, err.type, err.param, err.message) == (400, "BadRequestError", None, message)


def test_a_missing_or_wrongly_typed_input_is_a_validation_error() -> None:
    for body, param in (
        ({}, "body.input"),
        ({"input": 123}, "body.input"),
        ({"input": [1.5]}, "body.input.0"),
    ):
        err = _error(body)
        assert (err.status, err.type, err.param) == (400, "Bad Request", param), body
        assert "validation error" in err.message
    assert (
        "{'type': 'missing', 'loc': 'body.input', 'msg': 'Field required', 'input': '<dict of 0 items>'}"
        in (_error({}).message)
    )
    not_object = _error([1, 2])
    assert not_object.param == "body"
    assert not_object.message.startswith("5 validation errors:")  # one per vLLM request model


def test_an_unknown_model_is_404_without_aliases() -> None:
    err = _error({"model": "nope", "input": []})  # before the input is looked at
    assert (err.status, err.type, err.param) == (404, "NotFoundError", None)
    assert err.message == "The model `nope` does not exist."


def test_an_input_longer_than_the_context_is_refused_unless_truncated() -> None:
    err = _error({"input": [5] * 70})
    assert (err.status, err.param) == (400, "input_tokens")
    assert "your prompt contains 70 input tokens" in err.message
    assert "at least 65" in _error({"input": "word " * 100}).message
    assert _tokens(_plan({"input": [5] * 70, "truncate_prompt_tokens": 10})) == [10]
    assert _tokens(_plan({"input": [5] * 70, "truncate_prompt_tokens": -1})) == [64]
    assert "truncate_prompt_tokens" in _error({"input": "x", "truncate_prompt_tokens": 65}).message


def test_a_non_zero_priority_is_accepted_as_vllm_032_does() -> None:
    # Measured: vLLM 0.32 under the default fcfs policy answers a priority-5 embedding with 200.
    assert _plan({"input": "x", "priority": 3}).priority == 3


def test_encodings_of_one_vector() -> None:
    vec = vectors.embed(FOX, 16)
    assert encode(vec, "float", "float32", "native") == vec
    little = base64.b64decode(str(encode(vec, "base64", "float32", "little")))
    assert list(struct.unpack("<16f", little)) == vec
    big = base64.b64decode(str(encode(vec, "base64", "float32", "big")))
    assert list(struct.unpack(">16f", big)) == vec
    half = base64.b64decode(str(encode(vec, "base64", "float16", "little")))
    assert len(half) == 32
    assert all(abs(a - b) < 1e-3 for a, b in zip(struct.unpack("<16e", half), vec, strict=True))


def test_the_body_has_vllms_shape() -> None:
    job = _plan({"input": ["hello world", "a b"]})
    body = embedding_body(job, 8)
    assert list(body) == ["id", "object", "created", "model", "data", "usage"]
    assert (body["object"], body["model"]) == ("list", "tiny")
    assert [(d["index"], d["object"], len(d["embedding"])) for d in body["data"]] == [
        (0, "embedding", 8),
        (1, "embedding", 8),
    ]
    assert body["usage"] == {
        "prompt_tokens": 4,
        "total_tokens": 4,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


# -- a pooling engine in-process ----------------------------------------------------------------


@pytest.fixture
async def pooling() -> AsyncIterator[RunningEngine]:
    running = await start_enginesim(
        EngineSimSettings(model="tiny", port=0, speed=50, runner="pooling", embedding_dim=32)
    )
    try:
        yield running
    finally:
        await running.close()


async def test_a_pooling_engine_embeds_through_its_scheduler(pooling: RunningEngine) -> None:
    m = pooling.state.metrics
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{pooling.url}/v1/embeddings", json={"model": "tiny", "input": [[1, 2, 3], [4, 5]]}) as r,
    ):
        assert r.status == 200
        body = await r.json()
    assert [len(d["embedding"]) for d in body["data"]] == [32, 32]
    assert body["usage"]["prompt_tokens"] == 5
    assert m.prompt_tokens._value.get() == 5
    assert m.generation_tokens._value.get() == 0
    assert m.success["stop"]._value.get() == 2
    assert m.running._value.get() == 0
    sched = pooling.state.engine.scheduler
    assert not sched.has_work()
    assert sched.used_blocks == 0  # a pooling request's blocks are freed once its prefill is done


async def test_a_pooling_engine_refuses_generation_as_vllm(pooling: RunningEngine) -> None:
    async with aiohttp.ClientSession() as s:
        for path in ("/v1/chat/completions", "/v1/completions"):
            async with s.post(f"{pooling.url}{path}", json={"model": "tiny", "prompt": "x"}) as r:
                assert r.status == 404
                assert await r.json() == {"detail": "Not Found"}  # Starlette's, measured on vLLM
        async with s.get(f"{pooling.url}/v1/embeddings") as r:
            assert r.status == 405
            assert await r.json() == {"detail": "Method Not Allowed"}


async def test_a_generate_engine_refuses_embeddings_as_vllm() -> None:
    running = await start_enginesim(EngineSimSettings(model="tiny", port=0, speed=50))
    try:
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"{running.url}/v1/embeddings", json={"model": "tiny", "input": "x"}) as r,
        ):
            assert r.status == 404
            assert await r.json() == {"detail": "Not Found"}
    finally:
        await running.close()


async def test_fail_status_hits_embeddings_too(pooling: RunningEngine) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{pooling.url}/_sim/faults", json={"fail_status": 503, "times": 1}) as r:
            assert r.status == 200
        async with s.post(f"{pooling.url}/v1/embeddings", json={"input": "x"}) as r:
            assert r.status == 503
            assert (await r.json())["error"]["type"] == "ServiceUnavailableError"
        async with s.post(f"{pooling.url}/v1/embeddings", json={"input": "x"}) as r:
            assert r.status == 200


def test_the_cli_refuses_an_embedding_dim_below_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["enginesim", "--model", "m", "--runner", "pooling", "--embedding-dim", "0", "--port", "0"]) == 2
    )
    err = capsys.readouterr().err
    assert "--embedding-dim must be at least 1, got 0" in err
    assert err.count("\n") == 1
    with pytest.raises(SystemExit) as exited:  # argparse: not a runner
        main(["enginesim", "--model", "m", "--runner", "embed"])
    assert exited.value.code == 2
    assert "invalid choice: 'embed'" in capsys.readouterr().err
