"""The one builder of vLLM-shaped `chat.completion.chunk` events (enginesim and every test fake).

Field order and separators are vLLM's (compact JSON, `id, object, created, model, choices`, then
`usage` or other top-level fields), so a stand-in's bytes look like the engine's. An event is
`apps.core.protocol.openai.sse_event(chunk_payload(...))`.
"""

from __future__ import annotations

import json
from typing import Any


def chunk_payload(
    chunk_id: str,
    model: str,
    created: int,
    choices: list[dict[str, Any]],
    extra: dict[str, Any] | None = None,
) -> bytes:
    obj: dict[str, Any] = {
        "id": chunk_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if extra:
        obj.update(extra)
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def delta_choice(delta: dict[str, Any], finish: str | None = None, index: int = 0) -> dict[str, Any]:
    """One streamed choice as vLLM writes it (before its optional `stop_reason`/`token_ids`)."""
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}


def usage_block(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """vLLM's `usage` (its key order)."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
