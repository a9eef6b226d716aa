"""Chat-completion requests as vLLM 0.32 validates them (the bodies it answers with: `responses.py`).

`plan_chat()` turns a decoded JSON body into a `ChatJob` (prompt tokens, the clamped output
length of each choice, its finish reason and text) or raises `VllmError` with vLLM's status,
`type`, message wording and `param` (measured on 0.32: `docs/vllm-facts.md` §1, `docs/vllm-versions.md`):
pydantic-level problems are `type "Bad Request"` with `param "body.<field>"`; handler-level ones
are `BadRequestError` with a ` (parameter=X, value=V)` suffix; an unknown model is a 404
`NotFoundError`. A prompt longer than `max_model_len`, or `max_tokens` above it, is rejected;
prompt plus `max_tokens` beyond it is clamped (`finish_reason: "length"`), as 0.32 does.
"""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from apps.enginesim import textgen
from apps.enginesim.errors import (
    VllmError,
    bad_request,
    not_an_object,
    prompt_too_long,
    unknown_model,
    validation_error,
)

VLLM_VERSION = "0.32.0"


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = False


class EngineChatBody(BaseModel):
    """The fields enginesim acts on; unknown fields are accepted and ignored, as vLLM does."""

    model_config = ConfigDict(extra="allow")
    messages: list[dict[str, Any]]
    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int | None = 1
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    # vLLM's chat-template switches: continue the final (assistant) message instead of opening a
    # new one (the orchestrator's stream resume sends exactly this pair).
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    user: str | None = None  # OpenAI's end-user id; enginesim only echoes it into the timing log
    priority: int = 0  # vLLM's per-request priority (lower first; non-zero needs the priority policy)
    cache_salt: str | None = None  # vLLM's: only requests with the same salt share cached prompt blocks


@dataclass
class Choice:
    index: int
    words: list[str]  # content of each completion token, in order ("" for a hidden EOS)
    target_tokens: int
    finish_reason: str
    stop_reason: str | None = None


@dataclass
class ChatJob:
    request_id: str
    model: str
    created: int
    prompt_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool = False  # every chunk carries its choice's running usage (vLLM's rule)
    choices: list[Choice] = field(default_factory=list)
    user: str | None = None  # the body's `user` (benchmarks tag requests with it to join timings)
    priority: int = 0
    prompt_token_ids: tuple[int, ...] = ()  # what prefix caching hashes
    cache_salt: str | None = None
    # `--enable-prompt-tokens-details`: usage carries `prompt_tokens_details` with these two.
    prompt_details: bool = False
    cached_tokens: int = 0
    created_cache_tokens: int = 0

    def prompt_of(self, choice: Choice) -> tuple[int, tuple[int, ...]]:
        """The prompt `choice` continues: its token count and token ids (every choice's is the
        conversation's)."""
        return self.prompt_tokens, self.prompt_token_ids


def plan_chat(
    body: Any,
    *,
    served_model: str,
    max_model_len: int,
    mean_answer_tokens: int,
    server_seed: int,
) -> ChatJob:
    req = _checked_request(body, served_model)
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if any(s == "" for s in stops):
        raise bad_request("stop cannot contain an empty string.", "stop")
    pieces = textgen.chat_prompt_pieces(
        req.messages, req.add_generation_prompt, continue_final=req.continue_final_message
    )
    prompt = len(pieces)
    limit = _completion_limit(req, prompt, max_model_len)
    job = ChatJob(
        request_id=f"chatcmpl-{uuid.uuid4().hex[:16]}",
        model=served_model,
        created=int(time.time()),
        prompt_tokens=prompt,
        stream=bool(req.stream),
        # Measured on 0.32: `stream_options: {}` gives no usage chunk; only an explicit true does.
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        # As vLLM's `should_include_usage`: only together with include_usage.
        continuous_usage=bool(
            req.stream_options
            and req.stream_options.include_usage
            and req.stream_options.continuous_usage_stats
        ),
        user=req.user,
        priority=req.priority,
        prompt_token_ids=tuple(textgen.token_ids(pieces)),
        cache_salt=req.cache_salt,
    )
    n = req.n if req.n is not None else 1
    for index in range(n):
        choice = _choice(req, index, limit, mean_answer_tokens, server_seed)
        apply_stop_strings(choice, stops)
        job.choices.append(choice)
    return job


def _checked_request(body: Any, served_model: str) -> EngineChatBody:
    """The body as vLLM validates it, with vLLM's errors, before any token is counted."""
    if not isinstance(body, dict):
        raise not_an_object(body)
    try:
        req = EngineChatBody.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    if req.model not in (None, "", served_model):
        raise unknown_model(req.model, served_model)
    if req.continue_final_message and req.add_generation_prompt:
        # A pydantic model validator in vLLM: the "Bad Request" shape with `param "body"`.
        raise VllmError(
            400,
            "Bad Request",
            "1 validation error:\n  {'type': 'value_error', 'loc': 'body', 'msg': 'Value error, Cannot set "
            "both `continue_final_message` and `add_generation_prompt` to True.'}",
            "body",
        )
    if req.stream_options is not None and not req.stream:
        raise bad_request("Stream options can only be defined when `stream=True`.", "stream_options")
    if not req.messages:
        raise bad_request(
            "Cannot apply chat template to an empty conversation. Provide at least one message."
        )
    _check_contents(req.messages)
    n = req.n if req.n is not None else 1
    if n < 1:
        raise bad_request(f"n must be at least 1, got {n}.", "n", n)
    if req.temperature is not None and req.temperature < 0:
        raise bad_request(
            f"temperature must be non-negative, got {req.temperature}.", "temperature", req.temperature
        )
    if req.top_p is not None and not 0 < req.top_p <= 1:
        raise bad_request(f"top_p must be in (0, 1], got {req.top_p}.", "top_p", req.top_p)
    # A non-zero `priority` under fcfs is accepted and ignored, as vLLM 0.32 does (measured 2026-12-07 on an
    # fcfs server: 200 on chat, completions and embeddings; older releases refused it with a 400).
    return req


def _check_contents(messages: list[dict[str, Any]]) -> None:
    """vLLM's request model types `content` (a string, a list of parts, or null): anything else is
    its pydantic 400 ("Bad Request"), not a crash of the chat template."""
    for i, message in enumerate(messages):
        content = message.get("content")
        bad: str | None = None
        if content is not None and not isinstance(content, str | list):
            bad = f"body.messages.{i}.content"
        elif isinstance(content, list):
            bad = next(
                (
                    f"body.messages.{i}.content.{j}"
                    for j, p in enumerate(content)
                    if not isinstance(p, dict | str)
                ),
                None,
            )
        if bad is not None:
            message_text = f"1 validation error:\n  {{'type': 'string_type', 'loc': {bad!r}, 'msg': 'Input should be a valid string'}}"
            raise VllmError(400, "Bad Request", message_text, bad)


def _completion_limit(req: EngineChatBody, prompt: int, max_model_len: int) -> int:
    """How many tokens the answer may have: `max_tokens` within what the context leaves (vLLM's errors)."""
    if prompt > max_model_len:
        raise prompt_too_long(max_model_len, max_model_len + 1)
    asked = req.max_completion_tokens or req.max_tokens
    if asked is not None and asked < 1:
        raise bad_request(f"max_tokens must be at least 1, got {asked}.", "max_tokens", asked)
    if asked is not None and asked > max_model_len:
        raise bad_request(
            f"max_tokens={asked} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            "max_tokens",
            asked,
        )
    room = max_model_len - prompt
    if room < 1:
        raise bad_request(f"max_tokens must be at least 1, got {room}.", "max_tokens", room)
    return min(asked, room) if asked is not None else room


def _choice(req: EngineChatBody, index: int, limit: int, mean_answer_tokens: int, server_seed: int) -> Choice:
    """One choice's words: seeded by the conversation, its index and the seeds, as long as its natural
    length (finish `stop`) or the limit (finish `length`)."""
    # Continuing an assistant message: the answer is the one the conversation without it would get,
    # from the token after the given text when that text is its beginning (so a resumed stream
    # reads as if never interrupted); otherwise a fresh answer for the whole conversation.
    continued = req.continue_final_message and req.messages[-1].get("role") == "assistant"
    given = textgen.message_text(req.messages[-1].get("content")) if continued else ""
    fingerprint = textgen.prompt_fingerprint(req.messages[:-1] if continued else req.messages)
    rng = textgen.output_rng(server_seed, req.seed, f"{fingerprint}:{index}")
    natural = None if req.ignore_eos else textgen.natural_length(rng, mean_answer_tokens)
    if continued:
        done = textgen.continue_from(rng, given)
        if done is None:
            rng = textgen.output_rng(server_seed, req.seed, f"{fingerprint}:{given}:{index}")
        elif natural is not None:
            natural = natural - done if natural > done else None
    return choice_of_length(index, rng, natural, limit)


def choice_of_length(index: int, rng: random.Random, natural: int | None, limit: int) -> Choice:
    """A choice drawn from `rng`: `natural` tokens ending in a hidden EOS (finish `stop`) when that
    fits the `limit`, else `limit` tokens (finish `length`)."""
    if natural is not None and natural <= limit:
        target, reason = natural, "stop"
        words = [*textgen.generate_words(rng, target - 1), ""]  # the EOS token is counted, not shown
    else:
        target, reason = limit, "length"
        words = textgen.generate_words(rng, target)
    return Choice(index=index, words=words, target_tokens=target, finish_reason=reason)


def apply_stop_strings(choice: Choice, stops: list[str]) -> None:
    """Cut the choice at the first stop string its text holds (finish `stop`, `stop_reason` it)."""
    if not stops:
        return
    text = ""
    for i, word in enumerate(choice.words):
        before = len(text)
        text += word
        hits = [(text.find(s), s) for s in stops if s in text]
        if hits:
            pos, stop = min(hits)
            choice.words = [*choice.words[:i], text[before:pos] if pos > before else ""]
            choice.target_tokens = i + 1
            choice.finish_reason = "stop"
            choice.stop_reason = stop
            return


__all__ = [
    "VLLM_VERSION",
    "ChatJob",
    "Choice",
    "EngineChatBody",
    "StreamOptions",
    "VllmError",  # from `errors.py`, where every endpoint's error bodies are
    "apply_stop_strings",
    "bad_request",
    "choice_of_length",
    "plan_chat",
]
