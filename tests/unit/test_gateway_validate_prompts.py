"""`/v1/completions` and `/v1/embeddings` bodies (apps/gateway/validate_prompts.py): what each accepts,
the 400/404 each refusal gets (with its `param`), the budget the reservation covers, and the engine
body the agent builds from what the gateway forwards."""

from __future__ import annotations

from typing import Any

import pytest

from apps.core.errors import InvalidRequest, NotFound
from apps.core.protocol.engine import ENGINE_PATHS, engine_body
from apps.core.protocol.node import Assign
from apps.core.sharing import PriorityClass
from apps.core.spec import StackSpec, load_spec
from apps.gateway.validate import InferenceRequest, KeyCaps, validate_chat, wire_body
from apps.gateway.validate_prompts import (
    COMPLETION_DEFAULT_MAX_TOKENS,
    TEXT_OVERHEAD_TOKENS,
    max_embedding_inputs,
    validate_completion,
    validate_embeddings,
)

pytestmark = pytest.mark.timeout(30)

MODEL = "llama-3.1-8b-instruct"
EMBED = "test-embed"
DIMS = 1024


def _spec() -> StackSpec:
    """The dev stack with an embedding model of `DIMS` (whatever the stack itself names)."""
    spec = load_spec("dev")
    chat = spec.models[MODEL]
    serving = chat.serving.model_copy(update={"task": "embed"})
    embed = chat.model_copy(update={"serving": serving, "embedding_dimensions": DIMS})
    return spec.model_copy(update={"models": {**spec.models, EMBED: embed}})


SPEC = _spec()


def engine_sent(req: InferenceRequest) -> dict[str, Any]:
    """The engine's body for `req`, as the agent builds it from what the gateway sends."""
    endpoint = None if req.endpoint == "chat" else req.endpoint
    assign = Assign(
        request_id="r",
        model=req.model,
        body=wire_body(req),
        budget=req.budget,
        wants_chunk_usage=req.wants_chunk_usage,
        priority_class=PriorityClass.BATCH,
        cache_scope="team-7",
        endpoint=endpoint,
    )
    return engine_body(assign)


def _refused(call: Any, body: dict[str, Any], param: str | None, code: str | None = None) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        call(body, SPEC)
    assert info.value.param == param
    if code is not None:
        assert info.value.code == code
    return info.value


# -- completions ------------------------------------------------------------------------------


def test_a_completion_defaults_to_16_tokens_and_is_streamed_to_the_engine_with_usage() -> None:
    req = validate_completion({"model": MODEL, "prompt": "Once upon", "best_of": 4, "echo": True}, SPEC)
    assert (req.endpoint, req.stream, req.wants_usage, req.n) == ("completions", False, True, 1)
    assert req.max_tokens == COMPLETION_DEFAULT_MAX_TOKENS
    assert req.estimated_prompt_tokens == len(b"Once upon") + TEXT_OVERHEAD_TOKENS
    sent = engine_sent(req)
    assert "best_of" not in sent  # more choices than the budget's n: never forwarded
    assert sent["echo"] is True
    assert sent["prompt"] == "Once upon"
    assert (sent["max_tokens"], sent["n"], sent["stream"]) == (16, 1, True)
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert (sent["priority"], sent["cache_salt"]) == (10, "team-7")
    assert "messages" not in sent


def test_a_completion_budget_is_n_times_max_tokens_and_the_key_caps_apply() -> None:
    req = validate_completion(
        {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 40, "n": 3, "stream": True}, SPEC
    )
    assert req.estimated_prompt_tokens == 3  # token ids count as themselves
    assert req.budget.completion_tokens == 120
    assert req.worst_case_tokens == 123
    assert req.wants_usage is False  # streamed without include_usage
    with pytest.raises(InvalidRequest) as info:
        validate_completion({"model": MODEL, "prompt": "x", "max_tokens": 50}, SPEC, KeyCaps(max_tokens=20))
    assert info.value.param == "max_tokens"
    capped = validate_completion({"model": MODEL, "prompt": "x"}, SPEC, KeyCaps(max_tokens=8))
    assert capped.max_tokens == 8


def test_a_one_element_prompt_list_is_one_prompt() -> None:
    assert validate_completion({"model": MODEL, "prompt": ["hello"]}, SPEC).body["prompt"] == "hello"
    assert validate_completion({"model": MODEL, "prompt": [[1, 2]]}, SPEC).body["prompt"] == [1, 2]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL}, "prompt"),
        ({"model": MODEL, "prompt": ""}, "prompt"),
        ({"model": MODEL, "prompt": ["a", "b"]}, "prompt"),  # one prompt per request
        ({"model": MODEL, "prompt": 7}, "prompt"),
        ({"model": MODEL, "prompt": [1, -2]}, "prompt"),
        ({"model": MODEL, "prompt": [True]}, "prompt"),
        ({"model": MODEL, "prompt": "x", "stream": "yes"}, "stream"),
        ({"model": MODEL, "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"model": MODEL, "prompt": "x", "n": 99}, "n"),
        ({"prompt": "x"}, "model"),
    ],
)
def test_bad_completions_are_400_with_the_field_named(body: dict[str, Any], param: str) -> None:
    _refused(validate_completion, body, param)


def test_several_prompts_are_refused_with_a_reason() -> None:
    error = _refused(validate_completion, {"model": MODEL, "prompt": ["a", "b"]}, "prompt")
    assert "one prompt per completion request" in error.message


def test_endpoint_and_model_task_must_agree() -> None:
    _refused(validate_completion, {"model": EMBED, "prompt": "x"}, "model", "unsupported_model")
    _refused(
        validate_chat,
        {"model": EMBED, "messages": [{"role": "user", "content": "x"}]},
        "model",
        "unsupported_model",
    )
    _refused(validate_embeddings, {"model": MODEL, "input": "x"}, "model", "unsupported_model")
    with pytest.raises(NotFound):
        validate_completion({"model": "nope", "prompt": "x"}, SPEC)
    with pytest.raises(NotFound):
        validate_embeddings({"model": "nope", "input": "x"}, SPEC)


# -- embeddings -------------------------------------------------------------------------------


def test_embeddings_reserve_the_inputs_and_nothing_generated() -> None:
    req = validate_embeddings({"model": EMBED, "input": ["ab", "cde"], "stream": True, "top_k": 3}, SPEC)
    assert (req.endpoint, req.stream, req.max_tokens, req.n) == ("embeddings", False, 0, 1)
    assert req.estimated_prompt_tokens == 2 + 3 + 2 * TEXT_OVERHEAD_TOKENS
    assert req.budget.completion_tokens == 0
    sent = engine_sent(req)
    # No stream, no budget fields: an embedding request generates nothing; the priority and the
    # team's cache scope still apply.
    assert sent == {"model": EMBED, "input": ["ab", "cde"], "priority": 10, "cache_salt": "team-7"}


@pytest.mark.parametrize(
    "value", ["text", ["a", "b"], [1, 2, 3], [[1, 2], [3]]], ids=["str", "strs", "ids", "id-lists"]
)
def test_every_input_form_openai_takes_is_accepted(value: Any) -> None:
    req = validate_embeddings({"model": EMBED, "input": value, "encoding_format": "base64"}, SPEC)
    assert req.body["input"] == value


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": EMBED}, "input"),
        ({"model": EMBED, "input": ""}, "input.0"),
        ({"model": EMBED, "input": []}, "input"),
        ({"model": EMBED, "input": ["ok", ""]}, "input.1"),
        ({"model": EMBED, "input": ["ok", 5]}, "input.1"),
        ({"model": EMBED, "input": [[1], []]}, "input.1"),
        ({"model": EMBED, "input": {"text": "x"}}, "input"),
        ({"model": EMBED, "input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"model": EMBED, "input": "x", "dimensions": 0}, "dimensions"),
    ],
)
def test_bad_embeddings_are_400_with_the_field_named(body: dict[str, Any], param: str) -> None:
    _refused(validate_embeddings, body, param)


def test_the_input_count_is_bounded_by_what_one_answer_frame_carries() -> None:
    limit = max_embedding_inputs(DIMS)
    assert limit == 256  # 1,024 numbers of about 24 bytes each: 256 answers in 6 MiB
    assert max_embedding_inputs(128) == 2048  # OpenAI's own bound for a small model
    assert max_embedding_inputs(10**9) == 1
    validate_embeddings({"model": EMBED, "input": ["x"] * limit}, SPEC)
    error = _refused(validate_embeddings, {"model": EMBED, "input": ["x"] * (limit + 1)}, "input")
    assert f"At most {limit}" in error.message


def test_the_keys_context_cap_bounds_each_input() -> None:
    caps = KeyCaps(max_context=100)
    validate_embeddings({"model": EMBED, "input": ["a" * 80, "b" * 80]}, SPEC, caps)  # each alone fits
    with pytest.raises(InvalidRequest) as info:
        validate_embeddings({"model": EMBED, "input": ["a", "b" * 90]}, SPEC, caps)
    assert (info.value.param, info.value.code) == ("input", "context_length_exceeded")


def test_the_engine_paths_of_the_three_endpoints() -> None:
    assert ENGINE_PATHS == {
        None: "/v1/chat/completions",
        "completions": "/v1/completions",
        "embeddings": "/v1/embeddings",
    }


def test_a_resumed_completion_continues_its_prompt() -> None:
    req = validate_completion({"model": MODEL, "prompt": "Once upon", "max_tokens": 10}, SPEC)
    assign = Assign(
        request_id="r",
        model=MODEL,
        body=wire_body(req),
        budget=req.budget.after(3),
        continuation=" a time",
        endpoint="completions",
    )
    sent = engine_body(assign)
    assert sent["prompt"] == "Once upon a time"
    assert sent["max_tokens"] == 7
    assert "messages" not in sent
    assert "continue_final_message" not in sent
