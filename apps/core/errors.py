"""The one exception tree of llmfleet.

Every error a user can cause is a subclass of `LlmfleetError` and carries what the
OpenAI error envelope needs (HTTP status, `type`, `param`, `code`). The web layers map
it to a response in one place each; the CLI maps it to a one-line message and exit 2.
"""

from __future__ import annotations


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
