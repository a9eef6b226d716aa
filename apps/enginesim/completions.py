"""Legacy completion requests (`POST /v1/completions`) as vLLM 0.32 validates and plans them (the
bodies it answers with: `completion_bodies.py`).

`plan_completion()` turns a decoded JSON body into a `CompletionJob` or raises `VllmError` with
vLLM's status, type, message and `param`, in vLLM's order (measured on 0.32: `docs/enginesim.md`,
"Legacy completions and embeddings"): the request model's checks (prompt count, an empty or missing
prompt, `stream_options` without `stream`) before the field types, then the model (404), then
`max_tokens` against the context, the prompts (`prompts.py`), the sampling parameters, and last
the engine's input checks (`EngineInputError`: an event inside a stream). `prompt` is a string, a
list of strings, a list of token ids or a list of id lists; each prompt gets `n` choices (choice
`i * n + j` is prompt `i`'s `j`th), all run through the same engine, admission and KV cache as chat
(`generation.py`).

`max_tokens` defaults to 16 (null too), as vLLM's; prompt plus `max_tokens` beyond `max_model_len` is
clamped. A non-zero `priority` is accepted whatever the scheduling policy (measured: 0.32 does not
refuse it under fcfs). Not simulated (accepted and ignored): `echo`, `logprobs`, `suffix`.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from apps.enginesim import textgen
from apps.enginesim.chat import ChatJob, Choice, StreamOptions, apply_stop_strings, choice_of_length
from apps.enginesim.errors import VllmError, bad_request, not_an_object, unknown_model, validation_error
from apps.enginesim.prompts import Prompt, engine_rejection, no_prompt, prompt_list, tokenized, too_long

MAX_PROMPTS = 1024  # vLLM's VLLM_MAX_COMPLETION_PROMPTS default
DEFAULT_MAX_TOKENS = 16  # vLLM's (and OpenAI's) default for the legacy endpoint

TokenId = Annotated[int, Field(ge=0)]


class EngineCompletionBody(BaseModel):
    """The fields enginesim acts on, typed as vLLM's `CompletionRequest`; others are ignored."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: list[TokenId] | list[list[TokenId]] | str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = DEFAULT_MAX_TOKENS
    n: int = 1
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    user: str | None = None
    priority: int = 0
    cache_salt: str | None = None


@dataclass
class CompletionJob(ChatJob):
    """A chat job whose choices continue several prompts: `prompts[i]` is (token count, token ids)
    of prompt `i`, whose choices are `i * n` to `i * n + n - 1`."""

    n: int = 1
    prompts: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)

    def prompt_of(self, choice: Choice) -> tuple[int, tuple[int, ...]]:
        return self.prompts[choice.index // self.n]


def plan_completion(
    body: Any, *, served_model: str, max_model_len: int, mean_answer_tokens: int, server_seed: int
) -> CompletionJob:
    req = _checked_request(body, served_model)
    asked = req.max_tokens
    if asked is not None and asked > max_model_len:
        raise bad_request(
            f"max_tokens={asked} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            "max_tokens",
            asked,
        )
    prompts = [tokenized(p) for p in prompt_list(req.prompt)]
    if not prompts:
        raise no_prompt()
    for prompt in prompts:
        if (error := too_long(prompt, max_model_len)) is not None:
            raise error
    limits = [_limit(asked, p.tokens, max_model_len) for p in prompts]
    for limit in limits:  # each prompt's sampling parameters
        _check_sampling(req, limit)
    for prompt in prompts:
        if (rejected := engine_rejection(prompt)) is not None:
            rejected.stream = bool(req.stream)
            raise rejected
    job = CompletionJob(
        request_id=f"cmpl-{uuid.uuid4().hex[:16]}",
        model=served_model,
        created=int(time.time()),
        prompt_tokens=sum(p.tokens for p in prompts),
        stream=bool(req.stream),
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        continuous_usage=bool(
            req.stream_options
            and req.stream_options.include_usage
            and req.stream_options.continuous_usage_stats
        ),
        user=req.user,
        priority=req.priority,
        cache_salt=req.cache_salt,
        n=req.n,
        prompts=[(p.tokens, p.ids) for p in prompts],
    )
    _add_choices(job, req, prompts, limits, mean_answer_tokens, server_seed)
    return job


def _add_choices(
    job: CompletionJob,
    req: EngineCompletionBody,
    prompts: list[Prompt],
    limits: list[int],
    mean_answer_tokens: int,
    server_seed: int,
) -> None:
    """`n` choices per prompt, each seeded by its prompt, its place and the seeds."""
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    for i, (prompt, limit) in enumerate(zip(prompts, limits, strict=True)):
        for j in range(req.n):
            rng = textgen.output_rng(server_seed, req.seed, f"completion:{prompt.fingerprint}:{j}")
            natural = None if req.ignore_eos else textgen.natural_length(rng, mean_answer_tokens)
            choice = choice_of_length(i * req.n + j, rng, natural, limit)
            apply_stop_strings(choice, stops)
            job.choices.append(choice)


def _checked_request(body: Any, served_model: str) -> EngineCompletionBody:
    """vLLM's request-model checks, in its order: the prompt (count, presence) and stream options
    before the types, the model after them."""
    if not isinstance(body, dict):
        raise not_an_object(body)
    prompt = body.get("prompt")
    if (
        isinstance(prompt, list)
        and len(prompt) > MAX_PROMPTS
        and not all(isinstance(p, int) for p in prompt)  # several prompts, not one of token ids
    ):
        raise bad_request(
            f"prompt list length {len(prompt)} exceeds the maximum allowed count of {MAX_PROMPTS}. "
            "To increase this limit, set the VLLM_MAX_COMPLETION_PROMPTS environment variable.",
            "prompt",
        )
    if prompt is None or prompt == "":
        raise bad_request("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
    if body.get("stream_options") and not body.get("stream"):
        raise bad_request("Stream options can only be defined when `stream=True`.", "stream_options")
    try:
        req = EngineCompletionBody.model_validate(
            {**body, "max_tokens": DEFAULT_MAX_TOKENS} if body.get("max_tokens") is None else body
        )
    except ValidationError as exc:
        raise validation_error(exc) from None
    if req.model not in (None, "", served_model):
        raise unknown_model(req.model, served_model)
    return req


def _limit(asked: int | None, prompt: int, max_model_len: int) -> int:
    """vLLM's `get_max_tokens`: what the context leaves, at most what was asked."""
    room = max_model_len - prompt
    return min(room, asked) if asked is not None else room


def _check_sampling(req: EngineCompletionBody, max_tokens: int) -> None:
    """vLLM's `SamplingParams` checks, in its order (`max_tokens`: what `_limit` made of it)."""
    if req.n < 1:
        raise bad_request(f"n must be at least 1, got {req.n}.")
    if req.temperature is not None and req.temperature < 0:
        raise bad_request(
            f"temperature must be non-negative, got {req.temperature}.", "temperature", req.temperature
        )
    if req.top_p is not None and not 0 < req.top_p <= 1:
        raise bad_request(f"top_p must be in (0, 1], got {req.top_p}.", "top_p", req.top_p)
    if max_tokens < 1:
        raise bad_request(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens)
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if any(s == "" for s in stops):
        raise bad_request("stop cannot contain an empty string.")


__all__ = ["CompletionJob", "EngineCompletionBody", "VllmError", "plan_completion"]
