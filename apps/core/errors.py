"""The one exception tree of llmfleet.

Every error a user can cause is a subclass of `LlmfleetError` and carries what the
OpenAI error envelope needs (HTTP status, `type`, `param`, `code`). `http_error` is the one
mapping to an HTTP answer (status, headers with `Retry-After`, OpenAI body) that both HTTP apps
wrap in their framework's JSON response; the CLI maps an error to a one-line message and exit 2.
Storage exceptions (psycopg, redis) never leave a store: `apps.core.stores` translates them into
`StoreUnavailable` (and a duplicate key into the store's own error) at the store boundary.
"""

from __future__ import annotations

from collections.abc import Mapping


class LlmfleetError(Exception):
    """Base of every error the platform raises on purpose."""

    status: int = 500
    type: str = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.retry_after = retry_after

    def envelope(self) -> dict[str, object]:
        """OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class SpecError(LlmfleetError, ValueError):
    """A stack spec or a sizing input is invalid; the message names the field."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_spec"


class InvalidRequest(LlmfleetError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class PayloadTooLarge(LlmfleetError):
    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class AuthenticationFailed(LlmfleetError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDenied(LlmfleetError):
    status = 403
    type = "permission_error"
    code = "model_not_allowed"


class NotFound(LlmfleetError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class MethodNotAllowed(LlmfleetError):
    """405: a known path with a method it does not take (the answer carries `Allow`)."""

    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


def unknown_route(method: str, path: str, status: int) -> LlmfleetError:
    """The OpenAI envelope for a route the server does not have: 404 `unknown_url`, or 405 for a
    known path and another method (OpenAI says "Invalid URL (METHOD /path)" for both)."""
    message = f"Invalid URL ({method} {path[:200]})"
    if status == 405:
        return MethodNotAllowed(message)
    return NotFound(message, code="unknown_url")


class InsufficientBalance(LlmfleetError):
    status = 402
    type = "insufficient_quota"
    code = "insufficient_balance"


class RateLimited(LlmfleetError):
    """429; `code` names the limit (rpm, tokens_per_day, max_streams, queue_full)."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class Unavailable(LlmfleetError):
    """503: no healthy node, queue wait exceeded, a backing store unreachable."""

    status = 503
    type = "service_unavailable"
    code = "service_unavailable"


class UpstreamFailed(LlmfleetError):
    """502: the engine or node failed the request."""

    status = 502
    type = "server_error"
    code = "upstream_error"


class DuplicateRequestId(InvalidRequest):
    """The `x-request-id` was used before (the ledger's unique key)."""

    code = "duplicate_request_id"

    def __init__(self) -> None:
        super().__init__("Duplicate x-request-id.", param="x-request-id")


class StoreUnavailable(Unavailable):
    """A backing store failed (`store`: "postgres" or "redis"); raised by the store itself."""

    def __init__(self, store: str, message: str = "") -> None:
        super().__init__(message or f"{store} is unavailable", retry_after=5)
        self.store = store


class ForwardedError(LlmfleetError):
    """An error another hop already mapped (a node's `error` frame, an orchestrator's answer), or
    an answer with its own status and type: both are given when it is made, never changed after."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        error_type: str,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, param=param, retry_after=retry_after)
        self.status = status
        self.type = error_type
        self.code = code


def internal_token_rejected() -> ForwardedError:
    """The answer to a call on an internal endpoint without the platform's internal token."""
    return ForwardedError("invalid internal token", status=401, error_type="authentication_error")


def retry_after_header(seconds: float) -> str:
    """`Retry-After` in whole seconds, at least 1 (the one place it is formatted)."""
    return str(max(1, round(seconds)))


def http_error(
    exc: LlmfleetError, headers: Mapping[str, str] | None = None
) -> tuple[int, dict[str, str], dict[str, object]]:
    """(status, headers, OpenAI error body) for `exc`; `headers` are sent along (`x-request-id`,
    rate-limit headers). `Retry-After` is set when the error carries a hint."""
    out = dict(headers or {})
    if exc.retry_after is not None:
        out["Retry-After"] = retry_after_header(exc.retry_after)
    return exc.status, out, exc.envelope()
