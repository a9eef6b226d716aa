"""The bodies enginesim answers a chat completion with, as vLLM 0.32 writes them: the streamed
chunks (role, content, usage, the in-stream error) and the non-streaming body."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from apps.core.protocol.openai import sse_event
from apps.core.protocol.vllm import chunk_payload, delta_choice, usage_block
from apps.enginesim.chat import VLLM_VERSION, ChatJob, Choice


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def fingerprint() -> str:
    return f"vllm-{VLLM_VERSION}-enginesim"


def chunk(job: ChatJob, choices: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> bytes:
    return sse_event(chunk_payload(job.request_id, job.model, job.created, choices, extra))


def running_usage(job: ChatJob, completion_tokens: int) -> dict[str, Any]:
    """The per-chunk usage of `continuous_usage_stats` (measured on 0.32: with a null
    `completion_tokens_details`, placed right after `choices`)."""
    return {**usage(job, completion_tokens), "completion_tokens_details": None}


def role_chunk(job: ChatJob, index: int) -> bytes:
    choice = delta_choice({"role": "assistant", "content": ""}, index=index)
    extra: dict[str, Any] = {"usage": running_usage(job, 0)} if job.continuous_usage else {}
    return chunk(job, [choice], {**extra, "prompt_token_ids": None, "prompt_text": None})


def content_chunk(job: ChatJob, choice: Choice, token_index: int, last: bool, final_of_stream: bool) -> bytes:
    body = delta_choice(
        {"content": choice.words[token_index]}, choice.finish_reason if last else None, choice.index
    )
    if last:
        body["stop_reason"] = choice.stop_reason
    body["token_ids"] = None
    extra: dict[str, Any] = {}
    if job.continuous_usage:  # the running count of this choice: tokens 0..token_index
        extra["usage"] = running_usage(job, token_index + 1)
    if final_of_stream:
        extra["system_fingerprint"] = fingerprint()
    return chunk(job, [body], extra)


def usage(job: ChatJob, completion_tokens: int) -> dict[str, int]:
    return usage_block(job.prompt_tokens, completion_tokens)


def prompt_tokens_details(job: ChatJob, streaming: bool) -> dict[str, Any] | None:
    """vLLM 0.32 with `--enable-prompt-tokens-details` (measured: the stream leaves out the null
    `multimodal_tokens` that the JSON body has); None without the flag."""
    if not job.prompt_details:
        return None
    details: dict[str, Any] = {
        "cached_tokens": job.cached_tokens,
        "created_cache_tokens": job.created_cache_tokens,
    }
    return details if streaming else {**details, "multimodal_tokens": None}


def usage_chunk(job: ChatJob, completion_tokens: int) -> bytes:
    body: dict[str, Any] = usage(job, completion_tokens)
    if job.prompt_details:
        body = {**body, "prompt_tokens_details": prompt_tokens_details(job, streaming=True)}
    return chunk(job, [], {"usage": body, "system_fingerprint": fingerprint()})


@dataclass
class ChatFormat:
    """The stream of one chat job (`generation.StreamFormat`)."""

    job: ChatJob

    def opening(self, choice: Choice) -> bytes:
        return role_chunk(self.job, choice.index)

    def token(self, choice: Choice, token_index: int, last: bool, final_of_stream: bool) -> bytes:
        return content_chunk(self.job, choice, token_index, last, final_of_stream)

    def tail(self) -> bytes:
        job = self.job
        return usage_chunk(job, sum(c.target_tokens for c in job.choices)) if job.include_usage else b""


def error_event(message: str, type_: str = "InternalServerError", code: int = 500) -> bytes:
    # vLLM serialises the in-stream error with json.dumps defaults (", " and ": ").
    payload = json.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}})
    return b"data: " + payload.encode() + b"\n\n"


def completion_body(job: ChatJob) -> dict[str, Any]:
    total = sum(c.target_tokens for c in job.choices)
    return {
        "id": job.request_id,
        "object": "chat.completion",
        "created": job.created,
        "model": job.model,
        "choices": [
            {
                "index": c.index,
                "message": {
                    "role": "assistant",
                    "content": "".join(c.words),
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "tool_calls": [],
                    "reasoning": None,
                },
                "logprobs": None,
                "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason,
                "token_ids": None,
            }
            for c in job.choices
        ],
        "service_tier": None,
        "system_fingerprint": fingerprint(),
        "usage": {**usage(job, total), "prompt_tokens_details": prompt_tokens_details(job, streaming=False)},
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "kv_transfer_params": None,
    }
