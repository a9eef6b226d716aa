"""The one table of the errors a chat request can end with, and their wire forms (issue 28).

Every entry has one HTTP status, one OpenAI `type` and one string `code`, whichever process
writes it: the gateway, the orchestrator, or (as an `error` frame, `apps/core/protocol/node.py`)
the node agent. Before the first chunk an error is the HTTP answer (`apps.core.errors.http_error`:
the status, the OpenAI envelope, `Retry-After` when it has a hint). After the first chunk the
status is sent already (200): the error is one `data: {"error": ...}` event, then `data: [DONE]`
(`stream_error`, the only builder of that event), with the same `type` and `code`. docs/errors.md
lists the table.

A node's `error` frame carries a status and a type (`node_type`: what the agent writes in
`error_type`); `for_frame` is its entry.
"""

from __future__ import annotations

from dataclasses import dataclass

from apps.core.errors import ForwardedError
from apps.core.protocol.openai import SSE_DONE, sse_json


@dataclass(frozen=True)
class WireError:
    code: str
    status: int
    type: str
    after_first_chunk: bool  # can end a stream that started (as an SSE error event)
    meaning: str
    by: tuple[str, ...]  # the processes that raise it: gateway, orchestrator, agent
    before_first_chunk: bool = True  # can be the HTTP answer
    node_type: str = ""  # the `error_type` of the agent's `error` frame, when it is not `type`

    @property
    def frame_type(self) -> str:
        return self.node_type or self.type

    def exception(
        self, message: str, param: str | None = None, retry_after: float | None = None
    ) -> ForwardedError:
        """The error as raised before the first chunk (`http_error` makes the answer)."""
        return ForwardedError(
            message,
            status=self.status,
            error_type=self.type,
            param=param,
            code=self.code,
            retry_after=retry_after,
        )


GW, ORCH, AGENT = "gateway", "orchestrator", "agent"


def _e(
    code: str,
    status: int,
    type_: str,
    after: bool,
    meaning: str,
    by: tuple[str, ...] = (GW,),
    node_type: str = "",
    before: bool = True,
) -> WireError:
    return WireError(code, status, type_, after, meaning, by, before, node_type)


INVALID = "invalid_request_error"
UNAVAILABLE = "service_unavailable"
SERVER = "server_error"
RATE = "rate_limit_error"

INVALID_REQUEST = _e(
    "invalid_request", 400, INVALID, True, "the body is invalid, or the engine refused it", (GW, ORCH, AGENT)
)
MODEL_NOT_FOUND = _e(
    "model_not_found",
    404,
    INVALID,
    True,
    "no such model (or the engine does not serve it)",
    (GW, ORCH, AGENT),
)
UPSTREAM_ERROR = _e(
    "upstream_error", 502, SERVER, True, "the engine or its node failed, or was lost", (GW, ORCH, AGENT)
)
TIMEOUT = _e(
    "timeout",
    502,
    SERVER,
    True,
    "no first token, or no output for the idle deadline",
    (GW, ORCH, AGENT),
    "timeout",
)
SERVICE_UNAVAILABLE = _e(
    "service_unavailable", 503, UNAVAILABLE, True, "no node, or the engine is overloaded"
)
NODE_DRAINING = _e(
    "node_draining",
    503,
    UNAVAILABLE,
    True,
    "the node drained before the answer finished",
    node_type="node_draining",
)
GUARDRAIL_BLOCKED = _e(
    "guardrail_blocked",
    400,
    INVALID,
    True,
    "a check with action block of the team's guardrail policy matched the request or the answer",
)

TABLE: tuple[WireError, ...] = (
    INVALID_REQUEST,
    _e(
        "context_length_exceeded",
        400,
        INVALID,
        False,
        "the prompt and max_tokens exceed the key's context cap",
    ),
    _e("duplicate_request_id", 400, INVALID, False, "the x-request-id was used before"),
    _e("payload_too_large", 413, INVALID, False, "the body is over the size limit"),
    _e(
        "invalid_api_key",
        401,
        "authentication_error",
        False,
        "no valid key",
    ),
    _e(
        "insufficient_balance",
        402,
        "insufficient_quota",
        False,
        "the team's balance cannot cover the worst case",
    ),
    _e("expired_api_key", 401, "authentication_error", False, "the key expired"),
    _e("invalid_jwt", 401, "authentication_error", False, "the bearer JWT is not valid"),
    _e("expired_jwt", 401, "authentication_error", False, "the bearer JWT expired"),
    _e("model_not_allowed", 403, "permission_error", False, "the key may not use the model"),
    _e("no_team", 403, "permission_error", False, "the identity belongs to no team"),
    _e("revision_pin_forbidden", 403, "permission_error", False, "only an admin may pin a model revision"),
    _e("invalid_revision", 400, INVALID, False, "the x-llmfleet-model-revision header is malformed"),
    MODEL_NOT_FOUND,
    _e(
        "unsupported_model",
        400,
        INVALID,
        False,
        "the model serves another endpoint (an embedding model: /v1/embeddings only; a chat model: not it)",
    ),
    _e("rpm", 429, RATE, False, "the key's requests per minute"),
    _e("tokens_per_day", 429, RATE, False, "the key's tokens per day"),
    _e("max_streams", 429, RATE, False, "the key's concurrent requests"),
    _e("team_max_streams", 429, RATE, False, "the team's concurrent requests"),
    _e("team_tokens_per_minute", 429, RATE, False, "the team's tokens per minute"),
    _e("queue_full", 429, RATE, False, "the model's queue is full", (ORCH,)),
    _e("team_queue_full", 429, RATE, False, "the team's lanes of the model's queue are full", (ORCH,)),
    UPSTREAM_ERROR,
    SERVICE_UNAVAILABLE,
    _e("queue_timeout", 503, UNAVAILABLE, False, "no node within the queue wait", (ORCH,)),
    _e("no_orchestrator", 503, UNAVAILABLE, False, "the gateway reaches no orchestrator"),
    _e("dispatch_timeout", 503, UNAVAILABLE, False, "the orchestrator did not answer within the deadlines"),
    _e("ledger_unavailable", 503, UNAVAILABLE, False, "the ledger (PostgreSQL) is unreachable"),
    _e("redis_unavailable", 503, UNAVAILABLE, False, "the quota store (Redis) is unreachable"),
    _e("guardrails_unavailable", 503, UNAVAILABLE, False, "the team's guardrail policy cannot be read"),
    _e(
        "guard_unavailable", 503, UNAVAILABLE, False, "the guard model of a fail-closed policy did not answer"
    ),
    GUARDRAIL_BLOCKED,
    _e("model_unavailable", 503, UNAVAILABLE, False, "no node serves the model and none can start", (ORCH,)),
    _e("revision_not_served", 503, UNAVAILABLE, False, "no node serves the pinned model revision", (ORCH,)),
    _e("model_loading", 503, UNAVAILABLE, False, "the model is starting from zero nodes", (ORCH,)),
    _e("shutting_down", 503, UNAVAILABLE, False, "the gateway is stopping"),
    NODE_DRAINING,
    TIMEOUT,
)
BY_CODE: dict[str, WireError] = {e.code: e for e in TABLE}
assert len(BY_CODE) == len(TABLE)


def for_frame(status: int, error_type: str) -> WireError:
    """The entry of a node's `error` frame (its status and `error_type`)."""
    if error_type == NODE_DRAINING.node_type:
        return NODE_DRAINING
    if status == 404:
        return MODEL_NOT_FOUND
    if 400 <= status < 500:
        return INVALID_REQUEST
    if status == 503:
        return SERVICE_UNAVAILABLE
    if status == 504 or (status == TIMEOUT.status and error_type == TIMEOUT.node_type):
        return TIMEOUT
    return UPSTREAM_ERROR


def stream_error(entry: WireError, message: str, param: str | None = None) -> bytes:
    """The end of a stream that failed after its first chunk: the error event and `[DONE]`."""
    body = {"error": {"message": message, "type": entry.type, "param": param, "code": entry.code}}
    return sse_json(body) + SSE_DONE
