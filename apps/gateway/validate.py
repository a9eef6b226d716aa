"""Request validation before any quota or money is touched: body shape, model, limits, SSRF.

Prompt token estimate (conservative, for the reservation only; billing uses the engine's
exact counts): the UTF-8 byte length of the JSON-encoded `messages` plus 8 tokens per
message and 16 for the chat template. A byte-level BPE token always covers at least one
byte, so this is an upper bound for every tokenizer the catalog uses.

SSRF: `apps.gateway.ssrf`. What goes to the engine: `apps.gateway.fields` (the OpenAI chat
fields and an explicit allowlist of engine sampling extras; every other field is dropped), with
the request's `Budget` and intent beside it (the agent builds the engine's body).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from starlette.requests import Request

from apps.core.budget import Budget
from apps.core.errors import InvalidRequest, NotFound, PayloadTooLarge, PermissionDenied
from apps.core.identity.principal import Principal
from apps.core.protocol.dispatch import MODEL_REVISION_HEADER
from apps.core.spec import ModelSpec, StackSpec
from apps.gateway.fields import forwarded
from apps.gateway.ssrf import MAX_WALK_DEPTH, SystemResolver, check_ssrf, is_public_ip

__all__ = [
    "InferenceRequest",
    "KeyCaps",
    "SystemResolver",
    "check_ssrf",
    "is_public_ip",
    "parse_body",
    "pinned_revision",
    "read_body",
    "validate_chat",
    "wire_body",
]


Endpoint = Literal["chat", "completions", "embeddings"]


@dataclass(frozen=True)
class InferenceRequest:
    """A validated request of any endpoint (`validate_chat` here, `validate_completion` and
    `validate_embeddings` in `apps.gateway.validate_prompts`): what admission, the reservation and
    the dispatch need."""

    body: dict[str, Any]
    model: str
    stream: bool
    wants_usage: bool
    max_tokens: int  # the effective per-choice bound, sent to the engine as `max_tokens` (embeddings: 0)
    estimated_prompt_tokens: int
    n: int = 1
    wants_chunk_usage: bool = False  # usage on every chunk too (only with `wants_usage`)
    endpoint: Endpoint = "chat"

    @property
    def budget(self) -> Budget:
        """The request's token budget (apps/core/budget.py), built here once: the prompt bound and
        n x max_tokens, the worst case the reservation covers."""
        return Budget(self.estimated_prompt_tokens, self.worst_case_completion_tokens, self.n)

    @property
    def worst_case_completion_tokens(self) -> int:
        return self.n * self.max_tokens

    @property
    def worst_case_tokens(self) -> int:
        """What this request can cost at most, in tokens: the prompt bound + n x max_tokens."""
        return self.estimated_prompt_tokens + self.worst_case_completion_tokens


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """A JSON object, or a 400: not UTF-8 (CESU-8's encoded surrogates `ED A0 80` included, which
    `json.loads` on bytes would let through as a lone surrogate), not JSON, nested too deeply, not an
    object, or a string or key that is not valid Unicode (a lone surrogate such as `"\\ud800"`,
    which no UTF-8 encoder can write and which used to surface later as a 500)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(
            f"The request body is not valid UTF-8 (at byte {exc.start}).", param=None
        ) from None
    try:
        body = json.loads(text)
    except ValueError:
        raise InvalidRequest("We could not parse the JSON body of your request.", param=None) from None
    except RecursionError:
        raise InvalidRequest("The request body is nested too deeply.", param=None) from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.", param=None)
    # One walk: the depth bound always, and, only when an escape could have smuggled one past the
    # UTF-8 decoder, a lone surrogate in any string or key.
    bad = _lone_surrogate_path(body, "", 0, strings="\\u" in text)
    if bad is not None:
        raise InvalidRequest(
            "The request body contains invalid Unicode (a lone surrogate).", param=_printable(bad) or None
        )
    return body


def _printable(path: str) -> str:
    """`path` with what UTF-8 cannot encode escaped: the error answer itself must be writable."""
    return path.encode("utf-8", "backslashreplace").decode("utf-8")


def _lone_surrogate_path(node: Any, path: str, depth: int, *, strings: bool) -> str | None:
    """The path of the first string or key that is not valid Unicode (when `strings`), or None; a
    400 when the body is nested deeper than `MAX_WALK_DEPTH`."""
    if depth > MAX_WALK_DEPTH:
        raise InvalidRequest("The request body is nested too deeply.", param=_printable(path) or None)
    if isinstance(node, str):
        if strings:
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                return path
        return None
    if isinstance(node, dict):
        for key, value in node.items():
            sub = f"{path}.{key}" if path else key
            if strings and _lone_surrogate_path(key, sub, depth, strings=True) is not None:
                return sub
            if isinstance(value, dict | list | str):
                found = _lone_surrogate_path(value, sub, depth + 1, strings=strings)
                if found is not None:
                    return found
    elif isinstance(node, list):
        for i, value in enumerate(node):
            if isinstance(value, dict | list | str):
                found = _lone_surrogate_path(value, f"{path}.{i}", depth + 1, strings=strings)
                if found is not None:
                    return found
    return None


parse_body = parse_json_object


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, or a 413 as soon as it is larger than `limit` bytes (declared or read)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"Request body larger than {limit} bytes.")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"Request body larger than {limit} bytes.")
        chunks.append(chunk)
    return b"".join(chunks)


def positive_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidRequest(f"'{name}' must be a positive integer.", param=name)
    return value


def estimate_prompt_tokens(messages: list[Any]) -> int:
    return len(json.dumps(messages, separators=(",", ":")).encode()) + 8 * len(messages) + 16


@dataclass(frozen=True)
class KeyCaps:
    """A key's caps on one request (`api_keys.max_tokens`, `.max_context`; None: no cap).

    A `max_tokens` above the key's cap is refused (400, `param: max_tokens`), like OpenAI refuses one
    above the model's limit; without one, the effective `max_tokens` is the model's default clamped
    to the cap (and to what the context cap leaves after the prompt). The context cap bounds the
    prompt's conservative estimate (`estimate_prompt_tokens`) + `max_tokens`: over it, 400
    `context_length_exceeded` with `param: messages`."""

    max_tokens: int | None = None
    max_context: int | None = None


NO_CAPS = KeyCaps()


def _check_content(content: Any, i: int) -> None:
    """A message's `content`: a string, an array of content parts (objects; vLLM also takes bare
    strings), or null (an assistant message with tool calls). Anything else, such as a number, is a
    400 here rather than an engine error after the money and the slot were taken."""
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise InvalidRequest(
            f"'messages.{i}.content' must be a string or an array of content parts.",
            param=f"messages.{i}.content",
        )
    for j, part in enumerate(content):
        if not isinstance(part, dict | str):
            raise InvalidRequest(
                f"'messages.{i}.content.{j}' must be a content part (an object).",
                param=f"messages.{i}.content.{j}",
            )


def model_of(body: dict[str, Any], spec: StackSpec, task: str) -> tuple[str, ModelSpec]:
    """The request's model and its spec: a 400 when `model` is missing or the model's engine runs
    another task (a chat or completion for an embedding model, embeddings for a chat model), a 404
    when the stack has no such model."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a string.", param="model")
    model_spec = spec.models.get(model)
    if model_spec is None:
        raise NotFound(f"The model `{model}` does not exist.", param="model")
    if model_spec.serving.task != task:
        what = "embeddings (/v1/embeddings)" if model_spec.serving.task == "embed" else "text generation"
        raise InvalidRequest(
            f"The model `{model}` serves {what} only.", param="model", code="unsupported_model"
        )
    return model, model_spec


def stream_flags(body: dict[str, Any]) -> tuple[bool, bool, bool]:
    """(`stream`, usage wanted, usage on every chunk wanted) of a streamable body, or a 400."""
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean.", param="stream")
    options = body.get("stream_options")
    wants_usage = wants_chunk_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise InvalidRequest("'stream_options' must be an object.", param="stream_options")
        include = options.get("include_usage", False)
        if include is not None and not isinstance(include, bool):
            raise InvalidRequest("'include_usage' must be a boolean.", param="stream_options.include_usage")
        wants_usage = bool(include)
        wants_chunk_usage = wants_usage and options.get("continuous_usage_stats") is True
    return stream, wants_usage if stream else True, wants_chunk_usage


def max_tokens_and_n(body: dict[str, Any], spec: StackSpec, context: int) -> tuple[int | None, int]:
    """The client's `max_tokens` (or `max_completion_tokens`; None: not given) and `n`, or a 400."""
    max_tokens = positive_int(body, "max_completion_tokens") or positive_int(body, "max_tokens")
    if max_tokens is not None and max_tokens > context:
        param = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        raise InvalidRequest(
            f"'{param}' is too large: {max_tokens}. This model's maximum context length is {context} tokens.",
            param=param,
        )
    n = positive_int(body, "n") or 1
    if n > spec.request_limits.max_n:
        raise InvalidRequest(
            f"'n' is too large: {n}. At most {spec.request_limits.max_n} choices per request.", param="n"
        )
    return max_tokens, n


def validate_chat(body: dict[str, Any], spec: StackSpec, caps: KeyCaps = NO_CAPS) -> InferenceRequest:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a string.", param="model")
    messages = body.get("messages")
    if messages is None:
        raise InvalidRequest("'messages' is a required property.", param="messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty array.", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidRequest(f"'messages.{i}' must be an object with a 'role'.", param=f"messages.{i}")
        _check_content(message.get("content"), i)
    stream, wants_usage, wants_chunk_usage = stream_flags(body)
    model, model_spec = model_of(body, spec, "generate")
    context = model_spec.serving.max_model_len
    max_tokens, n = max_tokens_and_n(body, spec, context)
    prompt = estimate_prompt_tokens(messages)
    effective = capped_max_tokens(
        body, max_tokens, min(model_spec.serving.default_max_tokens, context), prompt, caps
    )
    return InferenceRequest(
        body=body,
        model=model,
        stream=stream,
        wants_usage=wants_usage,
        max_tokens=effective,
        estimated_prompt_tokens=prompt,
        n=n,
        wants_chunk_usage=wants_chunk_usage,
    )


def capped_max_tokens(
    body: dict[str, Any], asked: int | None, default: int, prompt: int, caps: KeyCaps
) -> int:
    """The effective per-choice `max_tokens` under the key's caps (`KeyCaps`), or a 400."""
    param = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    if asked is not None and caps.max_tokens is not None and asked > caps.max_tokens:
        raise InvalidRequest(
            f"'{param}' is too large: {asked}. This key allows at most {caps.max_tokens} completion tokens "
            "per request.",
            param=param,
        )
    effective = asked if asked is not None else min(default, caps.max_tokens or default)
    if caps.max_context is None:
        return effective
    if asked is None:
        effective = min(effective, caps.max_context - prompt)
    if prompt >= caps.max_context or prompt + effective > caps.max_context:
        raise InvalidRequest(
            f"This key's maximum context length is {caps.max_context} tokens. However, you requested up to "
            f"{prompt + max(effective, 0)} tokens ({prompt} in the messages, by the gateway's conservative "
            f"estimate, {max(effective, 0)} in the completion). Please reduce the length of the messages or "
            "completion.",
            param="messages",
            code="context_length_exceeded",
        )
    return effective


def wire_body(req: InferenceRequest) -> dict[str, Any]:
    """What the gateway forwards: the client's OpenAI fields and allowed engine extras only. The
    engine's body is built from it and the request's intent at the agent
    (apps/core/protocol/engine.py), once."""
    return forwarded(req.body, req.endpoint)


def pinned_revision(value: str | None, principal: Principal) -> str | None:
    """The model revision a request pins with the `x-llmfleet-model-revision` header (None: not
    pinned). Only an admin may pin (`llmfleet model eval` runs its golden set on a candidate that
    takes no production traffic); a team's key gets 403, a malformed value 400."""
    if value is None:
        return None
    if not principal.is_admin:
        raise PermissionDenied(
            f"Only an admin may pin a model revision ({MODEL_REVISION_HEADER}).",
            code="revision_pin_forbidden",
        )
    revision = value.strip()
    if not revision or len(revision) > 128 or not all(c.isalnum() or c in "._-" for c in revision):
        raise InvalidRequest(
            f"{MODEL_REVISION_HEADER} must be 1-128 letters, digits, '.', '_' or '-'.",
            param=MODEL_REVISION_HEADER,
            code="invalid_revision",
        )
    return revision
