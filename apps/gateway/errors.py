"""The gateway's JSON error answer: `apps.core.errors.http_error` in a Starlette response."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.responses import JSONResponse

from apps.core.errors import LlmfleetError, http_error


def error_response(exc: LlmfleetError, headers: Mapping[str, str] | None = None) -> JSONResponse:
    status, out, body = http_error(exc, headers)
    return JSONResponse(body, status_code=status, headers=out)
