"""A non-streaming answer assembled from the engine's streamed events (`ASSEMBLERS`, by endpoint).

The engine is always streamed, so usage and cancellation work the same for both kinds of client;
a client that asked for `stream: false` gets one body folded from the chunks: a `chat.completion`
(`assemble_completion`) or a `text_completion` (`assemble_text_completion`). An embeddings answer
is not streamed: its one event is the engine's body (`single_answer`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from apps.core.protocol.openai import DONE_PAYLOAD


def _chunks(payloads: list[bytes]) -> Iterator[dict[str, Any]]:
    """The parsed chunks (`[DONE]` skipped); an error event raises ValueError with its message."""
    for payload in payloads:
        if payload == DONE_PAYLOAD:
            continue
        chunk = json.loads(payload)
        if "error" in chunk:
            raise ValueError(chunk["error"].get("message", "upstream error"))
        yield chunk


def _fold(
    payloads: list[bytes],
    new_choice: Callable[[int], dict[str, Any]],
    add: Callable[[dict[str, Any], dict[str, Any]], None],
    obj: str,
) -> dict[str, Any]:
    """The body of `obj`: the first chunk's id, created, model (and fingerprint), each choice folded
    with `add` from `new_choice(index)`, and the last usage seen."""
    base: dict[str, Any] = {}
    choices: dict[int, dict[str, Any]] = {}
    usage: dict[str, Any] | None = None
    for chunk in _chunks(payloads):
        if not base:
            base = {k: chunk[k] for k in ("id", "created", "model") if k in chunk}
            if "system_fingerprint" in chunk:
                base["system_fingerprint"] = chunk["system_fingerprint"]
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            idx = choice.get("index", 0)
            slot = choices.get(idx)
            if slot is None:
                slot = choices[idx] = new_choice(idx)
            add(slot, choice)
            if choice.get("finish_reason") is not None:
                slot["finish_reason"] = choice["finish_reason"]
    body: dict[str, Any] = {"object": obj, **base, "choices": [choices[i] for i in sorted(choices)]}
    if usage is not None:
        body["usage"] = usage
    return body


def _chat_choice(idx: int) -> dict[str, Any]:
    # `refusal` is required by OpenAI's schema of a message; vLLM sends it null.
    message = {"role": "assistant", "content": "", "refusal": None}
    return {"index": idx, "message": message, "logprobs": None, "finish_reason": None}


def _add_chat(slot: dict[str, Any], choice: dict[str, Any]) -> None:
    delta = choice.get("delta") or {}
    if delta.get("content"):
        slot["message"]["content"] += delta["content"]
    if delta.get("tool_calls"):
        slot["message"].setdefault("tool_calls", []).extend(delta["tool_calls"])


def assemble_completion(payloads: list[bytes]) -> dict[str, Any]:
    """Fold streamed `chat.completion.chunk` payloads into one `chat.completion` body."""
    return _fold(payloads, _chat_choice, _add_chat, "chat.completion")


def _text_choice(idx: int) -> dict[str, Any]:
    return {"index": idx, "text": "", "logprobs": None, "finish_reason": None}


def _add_text(slot: dict[str, Any], choice: dict[str, Any]) -> None:
    slot["text"] += choice.get("text") or ""
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict):  # the legacy format: parallel lists, extended chunk by chunk
        merged = slot["logprobs"] if isinstance(slot["logprobs"], dict) else {}
        for key, value in logprobs.items():
            if isinstance(value, list):
                merged.setdefault(key, []).extend(value)
        slot["logprobs"] = merged


def assemble_text_completion(payloads: list[bytes]) -> dict[str, Any]:
    """Fold streamed `text_completion` payloads into one `text_completion` body."""
    return _fold(payloads, _text_choice, _add_text, "text_completion")


def single_answer(payloads: list[bytes]) -> dict[str, Any]:
    """An embeddings answer: the one event the node relayed, as the engine sent it."""
    bodies = list(_chunks(payloads))
    if len(bodies) != 1:
        raise ValueError(f"expected one answer, got {len(bodies)}")
    return bodies[0]


ASSEMBLERS: dict[str, Callable[[list[bytes]], dict[str, Any]]] = {
    "chat": assemble_completion,
    "completions": assemble_text_completion,
    "embeddings": single_answer,
}
