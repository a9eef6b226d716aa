"""Reading the engine's error shapes and mapping them to `error` frames.

vLLM has answered errors in three shapes over its versions (docs/vllm-facts.md §1):
nested `{"error": {"message", "type", "param", "code"}}` since 0.10.1, flat
`{"object": "error", "message", ...}` before, and `{"error": "Unauthorized"}` from its
`--api-key` middleware. Inside a 200 stream the same envelopes arrive as one
`data: {"error": ...}` event. Error text is passed to the client, never logged (it can
quote the prompt).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from apps.core.error_table import (
    INVALID_REQUEST,
    MODEL_NOT_FOUND,
    SERVICE_UNAVAILABLE,
    TIMEOUT,
    UPSTREAM_ERROR,
    WireError,
)


@dataclass(frozen=True)
class EngineError:
    entry: WireError  # what the client sees (apps/core/error_table.py)
    message: str
    param: str | None


def _fields(obj: dict[str, object], default_status: int) -> tuple[int, str, str | None, str | None]:
    message = obj.get("message")
    type_ = obj.get("type")
    param = obj.get("param")
    code = obj.get("code")
    status = code if isinstance(code, int) and 100 <= code <= 599 else default_status
    return (
        status,
        message if isinstance(message, str) else "engine error",
        type_ if isinstance(type_, str) else None,
        param if isinstance(param, str) else None,
    )


def parse_error_payload(raw: bytes, default_status: int) -> tuple[int, str, str | None, str | None]:
    """(status, message, engine type, param) from any of vLLM's error shapes."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return default_status, f"engine answered HTTP {default_status}", None, None
    if not isinstance(obj, dict):
        return default_status, f"engine answered HTTP {default_status}", None, None
    inner = obj.get("error")
    if isinstance(inner, dict):
        return _fields(inner, default_status)  # nested (>=0.10.1), or flat wrapped in-stream (<=0.10.0)
    if obj.get("object") == "error":
        return _fields(obj, default_status)  # flat (<=0.10.0)
    if isinstance(inner, str):
        return default_status, inner, None, None  # {"error": "Unauthorized"}
    return default_status, f"engine answered HTTP {default_status}", None, None


def classify(status: int, message: str, param: str | None) -> EngineError:
    """Map an engine status to what the client should see.

    The client's own mistakes (4xx: 404, else 400) pass through; an engine that refuses us
    (401/403: its `--api-key` is misconfigured) or is overloaded (429/503) is the
    platform's problem, so it becomes a 5xx that the orchestrator may retry elsewhere
    while no chunk has been sent.
    """
    if status == 404:
        return EngineError(MODEL_NOT_FOUND, message, param)
    if status in (401, 403):
        return EngineError(UPSTREAM_ERROR, "the engine refused the node agent (check its --api-key)", None)
    if status in (429, 503):
        return EngineError(SERVICE_UNAVAILABLE, message, None)
    if 400 <= status < 500:
        return EngineError(INVALID_REQUEST, message, param)
    return EngineError(TIMEOUT if status == 504 else UPSTREAM_ERROR, message, None)


def from_http(status: int, raw: bytes) -> EngineError:
    code, message, _type, param = parse_error_payload(raw, status)
    # The HTTP status wins over `code` for non-stream errors: vLLM sets both equal.
    del code
    return classify(status, message, param)


def from_stream_event(payload: bytes) -> EngineError:
    # vLLM labels in-stream errors 400 BadRequestError whatever the cause (0.11), 500 on
    # 0.32 when the engine died; an event without a usable code counts as 502.
    status, message, _type, param = parse_error_payload(payload, 502)
    return classify(status, message, param)
