"""OpenAI-compatible wire pieces shared by every app: SSE framing, the usage chunk,
the error envelope (assembling a non-streaming answer from chunks: `apps.core.protocol.assemble`).

The relay path never decodes content chunks (docs/architecture.md D5): `SseSplitter` only
finds event boundaries, and `is_usage_event` recognises vLLM's final usage chunk by
its `"choices":[]` without a JSON parse.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

DONE_PAYLOAD = b"[DONE]"
SSE_DONE = b"data: [DONE]\n\n"


def sse_event(payload: bytes) -> bytes:
    """Frame one SSE `data:` event."""
    return b"data: " + payload + b"\n\n"


def sse_json(obj: object) -> bytes:
    return sse_event(json.dumps(obj, separators=(",", ":")).encode())


class SseSplitter:
    """Incremental SSE reader: feed bytes, get whole `data:` payloads back.

    Handles `\\n\\n` and `\\r\\n\\r\\n` separators and events split across reads. Comment
    lines (`: keep-alive`) and non-data fields are dropped. Bounded: an event larger
    than `max_event_bytes` raises `ValueError` instead of growing without limit.
    """

    def __init__(self, max_event_bytes: int = 4 * 1024 * 1024) -> None:
        self._buf = b""
        self._max = max_event_bytes

    @property
    def pending(self) -> bool:
        """Bytes of an unfinished event are held (the next piece continues it)."""
        return bool(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        if b"\r" in self._buf:
            self._buf = self._buf.replace(b"\r\n", b"\n")
        events: list[bytes] = []
        while True:
            end = self._buf.find(b"\n\n")
            if end < 0:
                break
            raw, self._buf = self._buf[:end], self._buf[end + 2 :]
            lines = [ln[5:].lstrip(b" ") if ln.startswith(b"data:") else None for ln in raw.split(b"\n")]
            data_lines = [ln for ln in lines if ln is not None]
            if data_lines:
                events.append(b"\n".join(data_lines))
        if len(self._buf) > self._max:
            raise ValueError(f"SSE event larger than {self._max} bytes")
        return events


def is_usage_event(payload: bytes) -> bool:
    """vLLM's final usage chunk: `"choices":[]` together with `"usage"` (no JSON parse)."""
    return b'"choices":[]' in payload and b'"usage"' in payload


def is_error_event(payload: bytes) -> bool:
    return payload.startswith(b'{"error"')


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def parse_usage(payload: bytes) -> Usage | None:
    """Usage of a usage chunk (or of any chunk/body carrying `usage`), else None."""
    try:
        obj = json.loads(payload)
    except ValueError:
        return None
    usage = obj.get("usage") if isinstance(obj, dict) else None
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    return Usage(prompt, completion)


def one_line_answer(raw: bytes) -> tuple[bytes, int] | None:
    """A one-answer body (an embeddings response) as one SSE event's payload and its
    `usage.prompt_tokens`; None when it is not a JSON object with that count. The bytes are the
    engine's own unless they hold a line break, which would end the event early (then compact JSON)."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    usage = obj.get("usage") if isinstance(obj, dict) else None
    prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if not isinstance(prompt, int) or isinstance(prompt, bool) or prompt < 0:
        return None
    if b"\n" in raw or b"\r" in raw:
        raw = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    return raw, prompt


def cached_tokens(payload: bytes) -> int | None:
    """`usage.prompt_tokens_details.cached_tokens` of a usage chunk (vLLM with
    `--enable-prompt-tokens-details`), else None."""
    try:
        obj = json.loads(payload)
    except ValueError:
        return None
    usage = obj.get("usage") if isinstance(obj, dict) else None
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) and cached >= 0 else None
