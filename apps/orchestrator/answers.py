"""The orchestrator's error answers: before the first chunk the JSON answer, after it the end of
the stream; both from the one table (apps/core/error_table.py)."""

from __future__ import annotations

from aiohttp import web

from apps.core.error_table import TIMEOUT, UPSTREAM_ERROR, for_frame, stream_error
from apps.core.errors import LlmfleetError, http_error
from apps.orchestrator.streams import ErrorEv, LostEv


def error_response(exc: LlmfleetError, request_id: str = "") -> web.Response:
    """The orchestrator's JSON error answer: `apps.core.errors.http_error` in an aiohttp response."""
    status, headers, body = http_error(exc, {"x-request-id": request_id} if request_id else None)
    return web.json_response(body, status=status, headers=headers)


def mid_stream_error(ev: ErrorEv | LostEv | None, idle_s: float) -> bytes:
    """The end of a stream that failed after output: the node's error, a lost node, or silence
    past the idle deadline (None), as its entry of apps/core/error_table.py."""
    if ev is None:
        return stream_error(TIMEOUT, f"no output from the node for {idle_s:g} s")
    if isinstance(ev, ErrorEv):
        frame = ev.frame
        return stream_error(for_frame(frame.status, frame.error_type), frame.message, frame.param)
    return stream_error(UPSTREAM_ERROR, "the node serving this request was lost")
