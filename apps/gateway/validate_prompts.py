"""Validation of the two endpoints whose body holds a prompt instead of messages (issue 31):
`/v1/completions` (`validate_completion`) and `/v1/embeddings` (`validate_embeddings`). Each gives
an `InferenceRequest`, so admission, the reservation, the fair queue, the dispatch and the settle
are the chat's own (`apps.gateway.chat`).

Prompt token estimate (for the reservation and the key's context cap only; billing uses the
engine's counts): a text's UTF-8 byte length plus 16 (a byte-level BPE token covers at least one
byte; 16 covers the special tokens an engine adds), a token id list's length.

Completions take one prompt per request (a string, one token id list, or a list holding one of
them): a budget is `n` x `max_tokens` of one prompt, and several prompts would multiply what the
engine may generate past what was reserved. `max_tokens` defaults to 16, as OpenAI's and vLLM's.

Embeddings take up to `max_embedding_inputs(dimensions)` inputs: the answer travels as one frame
from the node (at most `apps.agent.relay.MAX_ANSWER_BYTES`), about 24 bytes per number as JSON.
"""

from __future__ import annotations

from typing import Any

from apps.core.errors import InvalidRequest
from apps.core.spec import StackSpec
from apps.gateway.validate import (
    NO_CAPS,
    InferenceRequest,
    KeyCaps,
    capped_max_tokens,
    max_tokens_and_n,
    model_of,
    positive_int,
    stream_flags,
)

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's default for `/v1/completions`
TEXT_OVERHEAD_TOKENS = 16
OPENAI_MAX_EMBEDDING_INPUTS = 2048  # OpenAI's own limit per request
EMBEDDING_ANSWER_BUDGET_BYTES = 6 * 1024 * 1024  # under the node frame's bound, with room for the rest
BYTES_PER_EMBEDDING_NUMBER = 24  # a float32 as JSON text (`-0.028356701135635376,`)
ENCODING_FORMATS = ("float", "base64")


def max_embedding_inputs(dimensions: int) -> int:
    """How many inputs one embeddings request may carry for a model of `dimensions`."""
    per_input = dimensions * BYTES_PER_EMBEDDING_NUMBER
    return max(1, min(OPENAI_MAX_EMBEDDING_INPUTS, EMBEDDING_ANSWER_BUDGET_BYTES // per_input))


def _token_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    )


def _estimate(item: str | list[int]) -> int:
    if isinstance(item, str):
        return len(item.encode()) + TEXT_OVERHEAD_TOKENS
    return len(item)


def _one_prompt(body: dict[str, Any]) -> str | list[int]:
    """The completion's one prompt, or a 400."""
    prompt = body.get("prompt")
    if prompt is None:
        raise InvalidRequest("'prompt' is a required property.", param="prompt")
    if (
        isinstance(prompt, list)
        and len(prompt) == 1
        and (isinstance(prompt[0], str) or _token_ids(prompt[0]))
    ):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequest("'prompt' must not be empty.", param="prompt")
        return prompt
    if _token_ids(prompt):
        return list(prompt)
    if (
        isinstance(prompt, list)
        and len(prompt) > 1
        and all(isinstance(p, str) or _token_ids(p) for p in prompt)
    ):
        raise InvalidRequest(
            "This platform takes one prompt per completion request: send each prompt as its own request.",
            param="prompt",
        )
    raise InvalidRequest("'prompt' must be a non-empty string or a list of token ids.", param="prompt")


def validate_completion(body: dict[str, Any], spec: StackSpec, caps: KeyCaps = NO_CAPS) -> InferenceRequest:
    prompt = _one_prompt(body)
    stream, wants_usage, wants_chunk_usage = stream_flags(body)
    model, model_spec = model_of(body, spec, "generate")
    context = model_spec.serving.max_model_len
    max_tokens, n = max_tokens_and_n(body, spec, context)
    estimate = _estimate(prompt)
    default = min(COMPLETION_DEFAULT_MAX_TOKENS, context)
    effective = capped_max_tokens(body, max_tokens, default, estimate, caps)
    return InferenceRequest(
        body={**body, "prompt": prompt},
        model=model,
        stream=stream,
        wants_usage=wants_usage,
        max_tokens=effective,
        estimated_prompt_tokens=estimate,
        n=n,
        wants_chunk_usage=wants_chunk_usage,
        endpoint="completions",
    )


def _inputs(body: dict[str, Any]) -> list[str | list[int]]:
    """The embeddings' inputs, each a non-empty string or token id list, or a 400."""
    value = body.get("input")
    if value is None:
        raise InvalidRequest("'input' is a required property.", param="input")
    items: list[Any]
    if isinstance(value, str) or _token_ids(value):
        items = [value]
    elif isinstance(value, list) and value:
        items = value
    else:
        raise InvalidRequest(
            "'input' must be a string, a list of strings, or token ids (a list or a list of lists).",
            param="input",
        )
    for i, item in enumerate(items):
        if isinstance(item, str):
            if not item:
                raise InvalidRequest(f"'input.{i}' must not be empty.", param=f"input.{i}")
        elif not _token_ids(item):
            raise InvalidRequest(
                f"'input.{i}' must be a non-empty string or a non-empty list of token ids.",
                param=f"input.{i}",
            )
    return items


def validate_embeddings(body: dict[str, Any], spec: StackSpec, caps: KeyCaps = NO_CAPS) -> InferenceRequest:
    items = _inputs(body)
    model, model_spec = model_of(body, spec, "embed")
    dimensions = model_spec.embedding_dimensions or 1
    limit = max_embedding_inputs(dimensions)
    if len(items) > limit:
        raise InvalidRequest(
            f"Too many inputs: {len(items)}. At most {limit} per request for `{model}`.", param="input"
        )
    encoding = body.get("encoding_format")
    if encoding is not None and encoding not in ENCODING_FORMATS:
        raise InvalidRequest("'encoding_format' must be 'float' or 'base64'.", param="encoding_format")
    positive_int(body, "dimensions")
    estimates = [_estimate(item) for item in items]
    longest = max(estimates)
    if caps.max_context is not None and longest > caps.max_context:
        raise InvalidRequest(
            f"This key's maximum context length is {caps.max_context} tokens. However, an input holds up "
            f"to {longest} tokens by the gateway's conservative estimate. Please shorten the input.",
            param="input",
            code="context_length_exceeded",
        )
    return InferenceRequest(
        body=body,
        model=model,
        stream=False,
        wants_usage=True,
        max_tokens=0,
        estimated_prompt_tokens=sum(estimates),
        endpoint="embeddings",
    )
