"""Gateway -> orchestrator: the internal dispatch call.

`POST {orchestrator}/internal/v1/dispatch` with a `DispatchRequest` JSON body and
`Authorization: Bearer <internal token>` (a secret shared by gateway and orchestrator).

Answer, before any byte of output:
  * an error status with the OpenAI error envelope (`503` + `Retry-After` when no node
    or the queue wait ran out, `429` + `Retry-After` when the model queue is full,
    `400`/`404` when the engine refused the body, `502` when the node failed);
Answer once output started:
  * `200 text/event-stream`: the SSE events to send to the client byte for byte: the
    engine's chunks, the usage chunk only if `client_wants_usage`, then `data: [DONE]`.
    A node failure after the first chunk is resumed once on another node when the model and
    the request allow it: the stream goes on with the same `id`, no second role chunk and one
    usage chunk counting every token sent (docs/control-plane.md, "Resume"). Otherwise, or
    when that fails, it arrives as one `data: {"error": ...}` event and `data: [DONE]`
    (never a silent truncation).

Sharing (issue 19): `team_weight` (the team's weight in the orchestrators' fair queue) and
`priority_class` (`interactive` | `batch`) come from the ledger and the key or JWT; both default to
the values an older gateway implied (1, interactive). A `429` may carry `team_queue_full` (the
team's lanes of the model's queue are full, or its predicted wait exceeds the limit).

Issue 28: the gateway sends the client's fields and its intent (`client_wants_chunk_usage`, the
budget's `n`) instead of an engine body; an orchestrator reads an older gateway's edited body the
same way, but an older orchestrator refuses the new fields: roll the orchestrators first.

The orchestrator settles the ledger row (`request_id`) with the engine's usage, at most the request's
`Budget` (`max_prompt_tokens` / `max_completion_tokens`); if
the gateway closes the connection early the orchestrator cancels the request on the
node and settles the tokens produced so far.
"""

from __future__ import annotations

import hmac
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from apps.core.budget import Budget
from apps.core.sharing import DEFAULT_WEIGHT, MAX_WEIGHT, PriorityClass

DISPATCH_PATH = "/internal/v1/dispatch"
# On a 503 from a stopping replica: nothing ran, send the dispatch to another replica.
RETRY_ELSEWHERE = "x-llmfleet-retry-elsewhere"
# On every dispatch answer: seconds the request waited in the orchestrator's queue for a node
# (the gateway's queue-wait metric), `%.6f`.
QUEUE_WAIT_HEADER = "x-llmfleet-queue-wait"
# The model revision the request's node serves (when the node said it: protocol version 6); the
# gateway passes it on to the client, so a caller can tell which version answered. On a request, an
# admin's pin of the revision to run on (`DispatchRequest.revision`).
MODEL_REVISION_HEADER = "x-llmfleet-model-revision"


def bearer(token: str) -> str:
    """The `Authorization` value of an internal call."""
    return f"Bearer {token}"


class InternalToken:
    """The internal token's check (gateway -> orchestrator dispatch, admin -> orchestrator): a
    constant-time comparison; an empty configured token accepts nothing."""

    __slots__ = ("_token",)

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    def accepts(self, authorization: str | None) -> bool:
        supplied = (authorization or "").removeprefix("Bearer ").encode()
        return bool(self._token) and hmac.compare_digest(supplied, self._token)


class Deadlines(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    queue_wait_s: float = Field(default=30.0, gt=0)
    first_token_s: float = Field(default=60.0, gt=0)
    idle_s: float = Field(default=30.0, gt=0)


class DispatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: str
    team_id: int
    key_id: int | None = None
    model: str
    # The client's body (its OpenAI fields and allowed engine extras, `apps/gateway/fields.py`),
    # as the client sent them: the agent builds the engine's body from it and the intent below
    # (`apps.core.protocol.engine`). An older gateway sent it edited already (the same result).
    body: dict[str, Any]
    client_wants_usage: bool = False
    # The client asked for usage on every chunk (`stream_options.continuous_usage_stats` with
    # usage on). None: an older gateway, which left the option in `body` only when it applied.
    client_wants_chunk_usage: bool | None = None
    deadlines: Deadlines = Deadlines()
    # The request's `Budget` (apps/core/budget.py), the worst case the gateway reserved for: prompt
    # bound, n x max_tokens and n. The orchestrator settles at most this, whatever a node reports
    # (None: an older gateway, no bound known; `n` None: an older gateway, the body's `n`).
    max_prompt_tokens: int | None = Field(default=None, ge=0)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    n: int | None = Field(default=None, ge=1)
    # The sharing model (`apps.core.sharing`): the team's weight in the fair queue and the
    # request's priority class (the key's or the JWT claim's). Absent from an older gateway: 1, interactive.
    team_weight: float = Field(default=DEFAULT_WEIGHT, gt=0, le=MAX_WEIGHT)
    priority_class: PriorityClass = PriorityClass.INTERACTIVE
    # A model revision the request must run on (issue 30 item 2: `llmfleet model eval` evaluates a
    # candidate that takes no production traffic); only an admin may ask (the gateway checks). None:
    # the model's rollout decides. An older orchestrator refuses the field: roll the orchestrators first.
    revision: str | None = Field(default=None, min_length=1, max_length=128)
    # The API endpoint the client called (issue 31): `chat` (`/v1/chat/completions`), `completions`
    # (`/v1/completions`) or `embeddings` (`/v1/embeddings`); the same admission, queue, reservation
    # and settle for all three. An older orchestrator refuses the field: roll the orchestrators first.
    endpoint: Literal["chat", "completions", "embeddings"] = "chat"

    @property
    def budget(self) -> Budget:
        n = self.n if self.n is not None else self.body.get("n")
        return Budget(
            self.max_prompt_tokens, self.max_completion_tokens, n if isinstance(n, int) and n > 0 else 1
        )

    @property
    def wants_chunk_usage(self) -> bool:
        if self.client_wants_chunk_usage is not None:
            return self.client_wants_chunk_usage
        options = self.body.get("stream_options")
        return isinstance(options, dict) and options.get("continuous_usage_stats") is True
