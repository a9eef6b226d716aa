"""The bodies enginesim answers a legacy completion with, as vLLM 0.32 writes them (measured:
`docs/enginesim.md`, "Legacy completions and embeddings").

- Stream: one `text_completion` chunk per token (`choices[0].text`; no role chunk, unlike chat),
  the choice's index being `prompt * n + j`; with `continuous_usage_stats` each chunk carries its
  choice's running usage; a choice's finishing chunk carries `system_fingerprint` unless a usage
  chunk follows; then the usage chunk (`choices: []`) when `include_usage`, then `[DONE]`.
- Non-streamed: one `text_completion` body with every choice and the summed usage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from apps.core.protocol.openai import sse_event
from apps.core.protocol.vllm import usage_block
from apps.enginesim.chat import Choice
from apps.enginesim.completions import CompletionJob
from apps.enginesim.responses import fingerprint

OBJECT = "text_completion"


def _event(obj: dict[str, Any]) -> bytes:
    return sse_event(json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode())


def _head(job: CompletionJob) -> dict[str, Any]:
    return {"id": job.request_id, "object": OBJECT, "created": job.created, "model": job.model}


def usage(job: CompletionJob) -> dict[str, int]:
    return usage_block(job.prompt_tokens, sum(c.target_tokens for c in job.choices))


@dataclass
class CompletionFormat:
    """The stream of one completion job (`generation.StreamFormat`)."""

    job: CompletionJob

    def opening(self, choice: Choice) -> bytes:
        return b""  # the legacy endpoint has no role chunk

    def token(self, choice: Choice, token_index: int, last: bool, final_of_stream: bool) -> bytes:
        job = self.job
        body = {
            "index": choice.index,
            "text": choice.words[token_index],
            "logprobs": None,
            "finish_reason": choice.finish_reason if last else None,
            "stop_reason": choice.stop_reason if last else None,
            "prompt_token_ids": None,
            "token_ids": None,
        }
        obj = {**_head(job), "choices": [body]}
        if job.continuous_usage:  # the running count of this choice, with its own prompt
            prompt, _ = job.prompt_of(choice)
            done = token_index + 1
            obj["usage"] = {"prompt_tokens": prompt, "total_tokens": prompt + done, "completion_tokens": done}
        if last and not job.include_usage:
            obj["system_fingerprint"] = fingerprint()
        return _event(obj)

    def tail(self) -> bytes:
        job = self.job
        if not job.include_usage:
            return b""
        body: dict[str, Any] = usage(job)
        if job.prompt_details:
            body["prompt_tokens_details"] = {"cached_tokens": job.cached_tokens}
        return _event({**_head(job), "choices": [], "usage": body, "system_fingerprint": fingerprint()})


def completion_body(job: CompletionJob) -> dict[str, Any]:
    # Measured: the legacy endpoint leaves `created_cache_tokens` null (chat fills it).
    details = (
        {"cached_tokens": job.cached_tokens, "created_cache_tokens": None, "multimodal_tokens": None}
        if job.prompt_details
        else None
    )
    return {
        **_head(job),
        "choices": [
            {
                "index": c.index,
                "text": "".join(c.words),
                "logprobs": None,
                "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason,
                "token_ids": None,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "routed_experts": None,
            }
            for c in job.choices
        ],
        "service_tier": None,
        "system_fingerprint": fingerprint(),
        "usage": {**usage(job), "prompt_tokens_details": details, "completion_tokens_details": None},
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }
