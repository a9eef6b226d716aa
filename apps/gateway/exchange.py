"""Per-request state of a request (chat, completion, embeddings) and the pure helpers around it: request
ids (scoped per team), the `x-ratelimit-*` headers of an admission, the refusal messages, reading an
upstream error envelope, the dispatch request. No I/O here; `apps.gateway.chat` does the work.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from apps.core.errors import (
    ForwardedError,
    InvalidRequest,
    LlmfleetError,
    RateLimited,
    Unavailable,
    UpstreamFailed,
)
from apps.core.guardrails.decisions import Decision
from apps.core.guardrails.policy import CompiledPolicy
from apps.core.identity.principal import Principal
from apps.core.protocol.dispatch import Deadlines, DispatchRequest
from apps.core.quota.admission import Admission, Verdict
from apps.gateway.validate import InferenceRequest, wire_body

REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{8,128}$")
# Statuses with which the orchestrator answers before anything ran on a node.
NOTHING_RAN = frozenset({400, 404, 409, 413, 422, 429, 503})


def request_id_for(request: Request) -> tuple[str, bool]:
    """(the request's `x-request-id`, whether the client chose it): the client's when it is
    well-formed, else a generated `chatcmpl-<uuid4 hex>`."""
    sent = request.headers.get("x-request-id", "")
    if REQUEST_ID_RE.match(sent):
        return sent, True
    return f"chatcmpl-{uuid.uuid4().hex}", False


def scoped_request_id(team_id: int, client_id: str, *, chosen: bool = True) -> str:
    """The internal id (ledger row, stream slot, dispatch) of a request: a client-chosen
    `x-request-id` lives in its team's namespace, `t<team>/<id>` (`/` never occurs in a client's id),
    whatever it looks like (`chatcmpl-...` included), so no team can see or pre-claim another's ids;
    only an id the gateway generated (a random uuid4) is used as it is."""
    return f"t{team_id}/{client_id}" if chosen else client_id


def _duration(seconds: float) -> str:
    return f"{max(seconds, 0.0):.3f}s"


def ratelimit_headers(adm: Admission) -> dict[str, str]:
    """OpenAI's `x-ratelimit-*` headers; for tokens, whichever of the key's daily budget and the
    team's per-minute budget is nearer (less remaining)."""
    headers: dict[str, str] = {}
    if adm.limits.rpm:
        headers["x-ratelimit-limit-requests"] = str(adm.limits.rpm)
        headers["x-ratelimit-remaining-requests"] = str(adm.remaining_requests())
        headers["x-ratelimit-reset-requests"] = _duration(adm.rpm_reset_s)
    day, minute = adm.remaining_tokens(), adm.remaining_team_tokens()
    team = adm.limits.team
    if minute is not None and team is not None and team.tokens_per_minute and (day is None or minute < day):
        headers["x-ratelimit-limit-tokens"] = str(team.tokens_per_minute)
        headers["x-ratelimit-remaining-tokens"] = str(minute)
        headers["x-ratelimit-reset-tokens"] = _duration(adm.team_tokens_reset_s)
    elif adm.limits.tokens_per_day:
        headers["x-ratelimit-limit-tokens"] = str(adm.limits.tokens_per_day)
        headers["x-ratelimit-remaining-tokens"] = str(day)
        headers["x-ratelimit-reset-tokens"] = _duration(adm.tokens_reset_s)
    return headers


REFUSALS = {
    Verdict.MAX_STREAMS: ("max_streams", "Too many concurrent streams for this key (max_streams={})."),
    Verdict.RPM: ("rpm", "Rate limit reached for requests per minute (rpm={})."),
    Verdict.TOKENS_PER_DAY: ("tokens_per_day", "Daily token quota exhausted (tokens_per_day={})."),
    Verdict.TEAM_MAX_STREAMS: (
        "team_max_streams",
        "Too many concurrent streams for your team (max_streams={}).",
    ),
    Verdict.TEAM_TOKENS_PER_MINUTE: (
        "team_tokens_per_minute",
        "Your team's token budget per minute is used up (tokens_per_minute={}).",
    ),
}


def upstream_envelope(raw: bytes, status: int) -> tuple[str, str | None, str | None, str | None]:
    """(message, type, param, code) of an upstream OpenAI error body; a body that is not one gives
    a generic message and nothing else."""
    try:
        error = json.loads(raw)["error"]
        message = error["message"]
    except (ValueError, KeyError, TypeError):
        return f"upstream answered {status}", None, None, None
    if not isinstance(error, dict) or not isinstance(message, str):
        return f"upstream answered {status}", None, None, None

    def text(name: str) -> str | None:
        value = error.get(name)
        return value if isinstance(value, str) and value else None

    return message, text("type"), text("param"), text("code")


def upstream_error(status: int, raw: bytes, retry_after: str | None) -> LlmfleetError:
    """The error an orchestrator's answer before the first chunk becomes (apps/core/error_table.py:
    its status, type and code reach the client as they were given)."""
    message, error_type, param, code = upstream_envelope(raw, status)
    hint = header_seconds(retry_after)
    exc_cls = {429: RateLimited, 503: Unavailable}.get(status)
    if exc_cls is not None:  # queue_full, queue_timeout...: the orchestrator's code reaches the client
        return exc_cls(message, param=param, code=code, retry_after=hint if hint is not None else 5.0)
    if status in NOTHING_RAN:  # the engine's or orchestrator's 4xx, as it was given
        return ForwardedError(
            message,
            status=status,
            error_type=error_type or InvalidRequest.type,
            param=param,
            code=code or InvalidRequest.code,
        )
    return UpstreamFailed(message, code=code if status >= 500 else None)


def header_seconds(value: str | None) -> float | None:
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0.0 <= seconds < 86_400 else None


@dataclass
class Exchange:
    """Per-request state the cleanup needs (and the log line reports)."""

    request_id: str  # internal: the ledger row, the stream slot, the dispatch (scoped per team)
    started: float
    client_id: str = ""  # what the client sent (or was given) as `x-request-id`, echoed back
    id_chosen: bool = True  # the client sent `client_id` (else the gateway generated it)
    principal: Principal | None = None
    model: str = "-"
    revision: str = ""  # the model revision whose engine answers ("" not said: an older node)
    pinned: str | None = None  # the revision an admin pinned the request to (`validate.pinned_revision`)
    status: int = 0
    slot_held: bool = False
    reserved: bool = False
    handed_over: bool = False  # the orchestrator may settle: it also clears the in-flight tokens
    headers: dict[str, str] = field(default_factory=dict)
    pending: tuple[asyncio.Future[None], ...] = ()  # admission and reservation running concurrently
    ledger_refusal: LlmfleetError | None = None  # the ledger's refusal (402...), counted if it is the answer
    policy: CompiledPolicy | None = None  # the team's guardrail policy (`apps.gateway.screening`)
    decisions: list[Decision] = field(default_factory=list)  # its decisions not yet counted for the console
    cache: Any = None  # the request's `apps.gateway.caching.CacheTurn` (None: the cache is not asked)


def dispatch_request(
    req: InferenceRequest, principal: Principal, team_id: int, ex: Exchange, deadlines: Deadlines
) -> DispatchRequest:
    """What the gateway asks of the orchestrator for `req` (apps/core/protocol/dispatch.py): the body it
    forwards, the intent (usage wanted, the budget, the sharing class, a pinned revision, the endpoint)."""
    budget = req.budget
    return DispatchRequest(
        request_id=ex.request_id,
        team_id=team_id,
        key_id=principal.key_id,
        model=req.model,
        body=wire_body(req),
        client_wants_usage=req.wants_usage,
        client_wants_chunk_usage=req.wants_chunk_usage,
        max_prompt_tokens=budget.prompt_tokens,
        max_completion_tokens=budget.completion_tokens,
        n=budget.n,
        team_weight=principal.team_weight,
        priority_class=principal.priority_class,
        revision=ex.pinned,
        endpoint=req.endpoint,
        deadlines=deadlines,
    )
