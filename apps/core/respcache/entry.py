"""What a cache entry holds and how it is given back (docs/response-cache.md).

`CapturedAnswer` collects a miss's answer as it streams: its chunks' payloads (each as the engine sent
it, after the team's output guardrails) and its usage. It is storable only when whole: it ended with
`[DONE]`, carried usage, held no error event and stayed under `MAX_ANSWER_BYTES`.

`CachedAnswer` is its stored form (compact JSON, zlib-compressed, then sealed with the team's key) and
replays it: as a stream of the same shape as a miss (the same chunks, each with the new request's id and
time, the usage chunk only when the client asked for it, then `[DONE]`), or folded into one body for a
non-streaming request exactly as a miss's answer is (`apps.core.protocol.assemble`).
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from apps.core.protocol.assemble import ASSEMBLERS
from apps.core.protocol.openai import (
    DONE_PAYLOAD,
    SSE_DONE,
    is_error_event,
    is_usage_event,
    parse_usage,
    sse_json,
)

MAX_ANSWER_BYTES = 512 * 1024  # a longer answer is not stored (the size bound counts stored bytes)
OBJECTS = {"chat": "chat.completion.chunk", "completions": "text_completion"}


@dataclass
class CapturedAnswer:
    endpoint: str
    payloads: list[bytes] = field(default_factory=list)
    usage: dict[str, int] | None = None
    size: int = 0
    done: bool = False
    spoiled: bool = False  # an error event, or too long: never stored

    def add(self, payload: bytes) -> bool:
        """Take one event's payload; False: it is the usage chunk (the caller decides whether it goes on)."""
        if payload == DONE_PAYLOAD:
            self.done = True
            return True
        if is_error_event(payload):
            self.spoiled = True
            return True
        if is_usage_event(payload):
            usage = parse_usage(payload)
            if usage is not None:
                self.usage = {
                    "prompt_tokens": usage.prompt_tokens,
                    "completion_tokens": usage.completion_tokens,
                }
            return False
        self.size += len(payload)
        if self.size > MAX_ANSWER_BYTES:
            self.spoiled = True
            self.payloads.clear()
        elif not self.spoiled:
            self.payloads.append(payload)
        return True

    def storable(self) -> CachedAnswer | None:
        if not self.done or self.spoiled or self.usage is None or not self.payloads:
            return None
        return CachedAnswer(self.endpoint, [p.decode() for p in self.payloads], self.usage)


@dataclass(frozen=True)
class CachedAnswer:
    endpoint: str
    chunks: list[str]
    usage: dict[str, int]

    @property
    def prompt_tokens(self) -> int:
        return int(self.usage["prompt_tokens"])

    @property
    def completion_tokens(self) -> int:
        return int(self.usage["completion_tokens"])

    def pack(self) -> bytes:
        doc = {"endpoint": self.endpoint, "chunks": self.chunks, "usage": self.usage}
        return zlib.compress(json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode(), 6)

    @classmethod
    def unpack(cls, data: bytes) -> CachedAnswer:
        doc = json.loads(zlib.decompress(data))
        return cls(doc["endpoint"], list(doc["chunks"]), dict(doc["usage"]))

    def _chunks(self, answer_id: str, created: int) -> Iterator[dict[str, Any]]:
        for text in self.chunks:
            chunk = json.loads(text)
            chunk["id"], chunk["created"] = answer_id, created
            yield chunk

    def stream(self, answer_id: str, *, with_usage: bool, created: int | None = None) -> Iterator[bytes]:
        """The SSE events of a streamed replay."""
        created = int(time.time()) if created is None else created
        model = None
        for chunk in self._chunks(answer_id, created):
            model = chunk.get("model", model)
            yield sse_json(chunk)
        if with_usage:
            yield sse_json(self._usage_chunk(answer_id, created, model))
        yield SSE_DONE

    def body(self, answer_id: str, created: int | None = None) -> dict[str, Any]:
        """The one body of a non-streaming replay, folded as a miss's is."""
        created = int(time.time()) if created is None else created
        chunks = [json.dumps(c).encode() for c in self._chunks(answer_id, created)]
        body = ASSEMBLERS[self.endpoint](chunks)
        body["usage"] = self._usage()
        return body

    def _usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    def _usage_chunk(self, answer_id: str, created: int, model: str | None) -> dict[str, Any]:
        chunk: dict[str, Any] = {"id": answer_id, "object": OBJECTS[self.endpoint], "created": created}
        if model is not None:
            chunk["model"] = model
        return {**chunk, "choices": [], "usage": self._usage()}
