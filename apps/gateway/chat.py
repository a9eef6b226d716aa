"""`POST /v1/chat/completions`, `/v1/completions` and `/v1/embeddings`: authenticate, validate,
admit, reserve, dispatch, relay. The three differ only in their validation (`VALIDATORS`) and in
how a non-streaming answer is assembled (`apps.gateway.collect`).

Order (the brief's cheapest first): key/JWT, body (413/400/404), allowlist (403), SSRF
(400), Redis admission in one round trip (429), ledger reservation (402), dispatch.
For a key with headroom the admission and the reservation run concurrently
(`apps.gateway.speculation`); a key at or near a limit gets them strictly in order.
From the moment a stream slot is taken, every path out releases it (shielded); a
reservation is cancelled when the orchestrator refused before anything ran, otherwise the
orchestrator settles it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive

from apps.core.aio import shielded
from apps.core.errors import (
    LlmfleetError,
    PermissionDenied,
    Unavailable,
    UpstreamFailed,
)
from apps.core.guardrails.decisions import GuardrailBlocked
from apps.core.guardrails.metrics import GuardrailMetrics
from apps.core.identity.principal import Principal
from apps.core.protocol.dispatch import MODEL_REVISION_HEADER, QUEUE_WAIT_HEADER, Deadlines
from apps.core.spec import StackSpec
from apps.gateway.auth import authenticate, require_team
from apps.gateway.caching import ResponseCaching
from apps.gateway.collect import Timeouts, collect
from apps.gateway.decision_counts import DecisionCounter
from apps.gateway.deps import GatewayDeps
from apps.gateway.errors import error_response
from apps.gateway.exchange import (
    NOTHING_RAN,
    Exchange,
    dispatch_request,
    header_seconds,
    request_id_for,
    scoped_request_id,
    upstream_error,
)
from apps.gateway.guard import GuardCall
from apps.gateway.holds import Holds
from apps.gateway.metrics import GatewayMetrics
from apps.gateway.ports import DispatchUnavailable, Upstream
from apps.gateway.relay import RelayOutcome, RelayResponse
from apps.gateway.screening import Screening
from apps.gateway.settings import GatewaySettings
from apps.gateway.validate import (
    Endpoint,
    InferenceRequest,
    KeyCaps,
    check_ssrf,
    parse_body,
    pinned_revision,
    read_body,
    validate_chat,
)
from apps.gateway.validate_prompts import validate_completion, validate_embeddings
from apps.netio import fastpath

log = logging.getLogger("llmfleet.gateway")

Validator = Callable[[dict[str, Any], StackSpec, KeyCaps], InferenceRequest]
VALIDATORS: dict[Endpoint, Validator] = {
    "chat": validate_chat,
    "completions": validate_completion,
    "embeddings": validate_embeddings,
}


class ChatHandler:
    def __init__(self, settings: GatewaySettings, deps: GatewayDeps, metrics: GatewayMetrics) -> None:
        self._s = settings
        self._d = deps
        self._m = metrics
        self._holds = Holds(settings, deps, metrics)
        guard = GuardCall(settings, deps)
        self._screening = Screening(deps.guardrails, GuardrailMetrics(deps.registry), guard)
        self._decisions = DecisionCounter(settings, deps, metrics)
        self._caching = ResponseCaching(settings, deps)

    async def handle(self, request: Request, endpoint: Endpoint = "chat") -> Response:
        client_id, chosen = request_id_for(request)
        ex = Exchange(client_id, time.monotonic(), client_id, id_chosen=chosen)
        try:
            return await self._handle(request, ex, endpoint)
        except LlmfleetError as exc:
            await self._holds.finish(ex, cancel_reservation=True)
            ex.status = exc.status
            self._m.requests.labels(ex.model, str(exc.status)).inc()
            self._m.refused(ex.model, exc.status, exc.code)
            await self._holds.count_refusal(ex, exc)
            await self._decisions.flush(ex)  # a block's, or those of a request refused after a redaction
            self._log(ex, error=exc.code)
            return error_response(exc, {"x-request-id": ex.client_id, **ex.headers})
        except BaseException:
            await shielded(
                self._holds.finish(ex, cancel_reservation=True), self._s.cleanup_timeout_s, "finish"
            )
            await shielded(self._decisions.flush(ex), self._s.cleanup_timeout_s, "count_decisions")
            raise

    async def _handle(self, request: Request, ex: Exchange, endpoint: Endpoint) -> Response:
        principal = await authenticate(request, self._d, self._s)
        ex.principal = principal
        team_id = require_team(principal)
        ex.request_id = scoped_request_id(team_id, ex.client_id, chosen=ex.id_chosen)
        body = parse_body(await read_body(request, self._s.max_body_bytes))
        caps = KeyCaps(principal.max_tokens, principal.max_context)
        chat = VALIDATORS[endpoint](body, self._d.spec, caps)
        ex.model = chat.model
        if not principal.may_use(chat.model):
            self._m.rejections.labels("model_not_allowed").inc()
            raise PermissionDenied(f"This key may not use the model `{chat.model}`.", param="model")
        ex.pinned = pinned_revision(request.headers.get(MODEL_REVISION_HEADER), principal)
        ex.policy = await self._screening.policy(team_id)
        screened = self._screening.screen_input(ex.policy, endpoint, chat.body, team_id, ex)
        if screened is not chat.body:  # redacted: validated again, so the estimate covers what is sent
            body, chat = screened, VALIDATORS[endpoint](screened, self._d.spec, caps)
        await self._screening.guard_input(ex.policy, endpoint, chat.body, principal, ex)
        await check_ssrf(body, self._d.resolver, self._s.ssrf_resolve_timeout_s)
        ex.cache = await self._caching.plan(chat, principal, ex)
        if ex.cache is not None:
            return await self._cached(chat, principal, team_id, ex, request.receive)
        await self._holds.admit_and_reserve(chat, principal, team_id, ex)
        return await self._dispatch(chat, principal, team_id, ex, request.receive)

    async def _cached(
        self, chat: InferenceRequest, principal: Principal, team_id: int, ex: Exchange, receive: Receive
    ) -> Response:
        """A request the response cache may answer: admitted first (a key at its limits never costs a
        lookup), then looked up; a hit is answered here and gives its admitted tokens back (no GPU works
        for it), a miss is reserved and dispatched like any request."""
        await self._holds.admit(principal, ex, chat.worst_case_tokens)
        ex.cache = await self._caching.find(ex.cache, principal, ex)
        if ex.cache is not None and ex.cache.found is not None:
            response = await self._caching.answer(ex.cache, chat, principal, ex)
            await self._holds.finish(ex, cancel_reservation=True)
            await self._decisions.flush(ex)
            self._m.requests.labels(chat.model, "200").inc()
            self._log(ex, ended="cache_hit")
            return response
        await self._holds.reserve_counted(chat, principal, team_id, ex)
        return await self._dispatch(chat, principal, team_id, ex, receive)

    async def _dispatch(
        self, chat: InferenceRequest, principal: Principal, team_id: int, ex: Exchange, receive: Receive
    ) -> Response:
        deadlines = Deadlines(
            queue_wait_s=self._s.queue_wait_s, first_token_s=self._s.first_token_s, idle_s=self._s.idle_s
        )
        dreq = self._caching.dispatching(ex.cache, dispatch_request(chat, principal, team_id, ex, deadlines))
        admitted_at = time.monotonic()
        try:
            async with asyncio.timeout(self._s.queue_wait_s + self._s.first_token_s):
                upstream = await self._d.dispatcher.open(dreq)
        except DispatchUnavailable:
            self._m.rejections.labels("no_orchestrator").inc()
            raise Unavailable("No orchestrator reachable.", code="no_orchestrator", retry_after=5) from None
        except TimeoutError:
            # The orchestrator may have started the request: leave the reservation for it to settle.
            ex.reserved, ex.handed_over = False, True
            self._m.reservations_open.dec()
            raise Unavailable(
                "Timed out waiting for a node.", code="dispatch_timeout", retry_after=5
            ) from None
        self._m.dispatch.labels(chat.model).observe(time.monotonic() - admitted_at)
        queued = header_seconds(upstream.headers.get(QUEUE_WAIT_HEADER))
        if queued is not None:
            self._m.queue_wait.labels(chat.model).observe(queued)
        if upstream.status != 200:
            return await self._upstream_error(upstream, ex)
        upstream = self._screening.screen_output(upstream, ex.policy, chat.endpoint, team_id, ex)
        upstream = self._caching.capture(ex.cache, upstream, chat.wants_usage)
        self._m.active_streams.inc()  # `_after_relay` ends it (`stream_ended`)
        headers = {"x-request-id": ex.client_id, **ex.headers}
        ex.revision = upstream.headers.get(MODEL_REVISION_HEADER, "")
        if ex.revision:  # which version of the model answers (the node's, as it registered)
            headers[MODEL_REVISION_HEADER] = ex.revision
        if chat.stream:
            return RelayResponse(
                upstream,
                headers=headers,
                first_token_s=self._s.first_token_s,
                idle_s=self._s.idle_s,
                watch_usage=chat.wants_usage,
                cleanup=lambda outcome: self._after_relay(ex, upstream, outcome),
                cleanup_timeout_s=self._s.cleanup_timeout_s,
                max_request_s=self._s.max_request_s,
                fast_paths=self._s.netio_fastpaths,
            )  # type: ignore[return-value]
        return await self._collect(upstream, ex, headers, receive, chat.endpoint)

    async def _upstream_error(self, upstream: Upstream, ex: Exchange) -> Response:
        try:
            raw = await upstream.read_body()
        finally:
            await upstream.aclose()
        retry_after = upstream.headers.get("retry-after")
        ran = upstream.status not in NOTHING_RAN
        if ran:
            # Something may have run on a node: the orchestrator settles, we must not cancel.
            ex.reserved, ex.handed_over = False, True
            self._m.reservations_open.dec()
        raise upstream_error(upstream.status, raw, retry_after)

    async def _collect(
        self, upstream: Upstream, ex: Exchange, headers: dict[str, str], receive: Receive, endpoint: Endpoint
    ) -> Response:
        """A non-streaming request (`apps.gateway.collect`): one JSON body, or 499 when the client left."""
        outcome = RelayOutcome()
        timeouts = Timeouts(self._s.first_token_s, self._s.idle_s, self._s.max_request_s)
        try:
            try:
                body = await collect(upstream, outcome, receive, timeouts, endpoint)
            except UpstreamFailed:
                blocked = getattr(upstream, "blocked", None)  # a screened upstream's (under a capture too)
                if blocked is not None:
                    raise GuardrailBlocked(blocked) from None  # only what ran is billed
                raise
            if body is None:
                return Response(status_code=499)  # nobody is listening; the server drops it
        finally:
            await shielded(self._after_relay(ex, upstream, outcome), self._s.cleanup_timeout_s, "after_relay")
        usage = body.get("usage") or {}
        outcome.completion_tokens = usage.get("completion_tokens")
        if isinstance(outcome.completion_tokens, int):
            self._m.output_tokens.labels(ex.model).inc(outcome.completion_tokens)
        return JSONResponse(body, headers=headers)

    async def _after_relay(self, ex: Exchange, upstream: Upstream, outcome: RelayOutcome) -> None:
        ended_at = time.monotonic()
        # Release the stream slot first (one cheap Redis call) so a slow socket close can never
        # eat the cleanup budget and leak the slot; then close upstream so the orchestrator cancels
        # the request on the node and settles what was produced (it owns settlement from here on).
        try:
            await self._holds.finish(ex, cancel_reservation=False)
        finally:
            await upstream.aclose()
        if ex.reserved:
            ex.reserved = False
            self._m.reservations_open.dec()
        ex.status = 200 if outcome.ended == "done" else 499 if outcome.ended == "disconnect" else 502
        self._m.requests.labels(ex.model, str(ex.status)).inc()
        ttft = None if outcome.first_byte_at is None else outcome.first_byte_at - ex.started
        if ttft is not None:
            self._m.ttft.labels(ex.model).observe(ttft)
        if ex.revision:
            self._m.revision_ended(ex.model, ex.revision, outcome.ended, ttft)
        # The team's id, never its name: the admin console and dashboards map ids to names.
        team = str(ex.principal.team_id) if ex.principal and ex.principal.team_id is not None else "-"
        self._m.stream_ended(
            model=ex.model,
            team=team,
            ttft_s=ttft,
            output_s=None if outcome.first_byte_at is None else ended_at - outcome.first_byte_at,
            completion_tokens=outcome.completion_tokens,
            done=outcome.ended == "done",
            slo=self._d.spec.slo,
        )
        if outcome.completion_tokens is not None:
            self._m.output_tokens.labels(ex.model).inc(outcome.completion_tokens)
        self._caching.remember(ex.cache, team, ex.revision, outcome.ended)
        await self._decisions.flush(ex)  # the answer has been sent (a stream) or is about to be
        if outcome.direct_chunks:
            self._m.relayed_chunks.labels("direct").inc(outcome.direct_chunks)
        if outcome.asgi_chunks:
            self._m.relayed_chunks.labels("asgi").inc(outcome.asgi_chunks)
        self._m.netio.served(fastpath.UVICORN_CHUNK, fast=outcome.direct_chunks, fallback=outcome.asgi_chunks)
        self._log(ex, ended=outcome.ended, completion_tokens=outcome.completion_tokens)

    async def cache_janitor(self) -> None:
        await self._caching.janitor()

    async def settle_writes(self) -> None:
        """At shutdown: the response cache's writes in flight end (within the cleanup budget) or are dropped."""
        try:
            async with asyncio.timeout(self._s.cleanup_timeout_s):
                await self._caching.drain()
        except TimeoutError:
            log.warning("response cache writes still running at shutdown: dropped")

    def _log(self, ex: Exchange, **extra: Any) -> None:
        log.info(
            "request",
            extra={
                "request_id": ex.request_id,
                "team": ex.principal.team_name if ex.principal else None,
                "model": ex.model,
                "status": ex.status,
                "duration_ms": round((time.monotonic() - ex.started) * 1000, 2),
                **extra,
            },
        )
