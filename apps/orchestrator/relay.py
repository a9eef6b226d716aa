"""`POST /internal/v1/dispatch`: queue, pick, assign, relay — one request, at most two nodes.

Phases and deadlines: queue wait (min of the request's and the replica's 30 s limit;
503/429 + Retry-After), first token (`deadlines.first_token_s`: a connected but silent
node is cancelled and the request retried), idle between chunks (`deadlines.idle_s`).
A request is retried once on another node while nothing has been sent to the gateway
(`apps.core.scheduling.retry`, shared with `llmfleet simulate`; an assignment that reached no
node, e.g. one whose socket was moving between replicas, is tried again without counting; a stopping replica sends its waiting requests to another replica); once
output started, a node failure resumes the stream once on another node (`resume.py`) when the
model and the request allow it, and otherwise (or when that fails) becomes one error event and
`data: [DONE]`.
Content chunks are written as the node sent them (docs/architecture.md D5). Cleanup (slot release,
route removal, cancel on the node, reservation cancel) is shielded and bounded.
"""

from __future__ import annotations

import asyncio
import enum
import json

from aiohttp import web
from pydantic import ValidationError
from redis.exceptions import RedisError

from apps.core.aio import shielded
from apps.core.budget import Usage
from apps.core.error_table import for_frame
from apps.core.errors import (
    InvalidRequest,
    LlmfleetError,
    NotFound,
    Unavailable,
    UpstreamFailed,
    internal_token_rejected,
)
from apps.core.nodes import keys
from apps.core.protocol.dispatch import QUEUE_WAIT_HEADER, DispatchRequest, InternalToken
from apps.core.protocol.node import Error
from apps.core.protocol.openai import SSE_DONE, sse_event
from apps.core.scheduling.prefix import PrefixWeights, chat_messages, lookup_keys, prefix_outcome, team_scope
from apps.core.scheduling.retry import RetryBudget, queue_budget
from apps.core.sharing import PriorityClass
from apps.orchestrator.answers import error_response, mid_stream_error
from apps.orchestrator.handover import STOPPING, refuse_dispatch
from apps.orchestrator.logs import event
from apps.orchestrator.outlet import GatewayOutlet
from apps.orchestrator.plane import RelayParts
from apps.orchestrator.queue import share_of
from apps.orchestrator.resume import Outcome, Reason, Resumer, can_resume, resume_reason
from apps.orchestrator.routing import assignment
from apps.orchestrator.scheduling.view import NodeView, PickRequest
from apps.orchestrator.streams import ChunkEv, DoneEv, ErrorEv, LostEv, RequestStream
from apps.orchestrator.sweeper import partial_usage

CLEANUP_S = 5.0
PREFIX_LOOKUP_S = 0.25  # a pick waits this long at most for the prefix announcements


class Retry(enum.StrEnum):
    UNREACHABLE = "unreachable"
    FIRST_TOKEN_TIMEOUT = "first_token_timeout"
    NODE_ERROR = "node_error"
    NODE_LOST = "node_lost"


class DispatchHandler:
    def __init__(self, parts: RelayParts) -> None:
        self.parts = parts
        self._token = InternalToken(parts.settings.internal_token.get_secret_value())

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if not self._token.accepts(request.headers.get("Authorization")):
            return error_response(internal_token_rejected())
        try:
            dreq = DispatchRequest.model_validate_json(await request.read())
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            return error_response(
                InvalidRequest(f"invalid dispatch request: {loc}: {first['msg']}", param=loc)
            )
        if self.parts.lifecycle.stopping:
            return refuse_dispatch(dreq.request_id)
        if dreq.model not in self.parts.models:
            return error_response(
                NotFound(f"model {dreq.model!r} is not served here", param="model"), dreq.request_id
            )
        return await _Relay(self.parts, request, dreq).run()


class _Relay:
    def __init__(self, parts: RelayParts, request: web.Request, dreq: DispatchRequest) -> None:
        self.parts = parts
        self.request = request
        self.dreq = dreq
        self.out = GatewayOutlet(
            request,
            dreq,
            resumable=can_resume(dreq, parts.resume_models),
            fast_paths=parts.settings.netio_fastpaths,
        )
        self.outcome = "ok"
        self._t0 = parts.monotonic()
        self.queued_s = 0.0  # time in the model's queue waiting for a node (all attempts)
        self.share = share_of(dreq)
        self.prefix: dict[str, int] = {}  # node id -> blocks of the conversation prefix it holds
        self.weights = parts.prefix_weights.get(dreq.model, PrefixWeights())
        self.revisions: frozenset[str] | None = None  # a canary split's (apps/orchestrator/canary.py)
        self.probe = parts.canaries.probe(dreq.model, None)  # each attempt's, for the canary judge

    async def run(self) -> web.StreamResponse:
        parts, dreq = self.parts, self.dreq
        parts.metrics.active_relays.inc()
        try:
            return await self._dispatch()
        except asyncio.CancelledError:
            if self.out.response is None:
                self.outcome = "gateway_disconnected"
                await self._cancel_reservation()
            raise
        finally:
            self.out.count_paths(parts.metrics.netio)
            parts.metrics.active_relays.dec()
            parts.metrics.dispatches.labels(model=dreq.model, outcome=self.outcome).inc()
            event(
                "dispatch",
                request_id=dreq.request_id,
                model=dreq.model,
                outcome=self.outcome,
                chunks=self.out.chunks,
                seconds=round(parts.monotonic() - self._t0, 4),
            )

    async def _dispatch(self) -> web.StreamResponse:
        """A cold-start check, then at most `MAX_ATTEMPTS` nodes (plus `MAX_UNREACHABLE` that the
        assignment never reached; `apps.core.scheduling.retry`): queue for one, relay from it. A stopping replica sends what
        still waits in its queue to another replica (`refuse_dispatch`)."""
        parts, dreq = self.parts, self.dreq
        queue_limit = min(dreq.deadlines.queue_wait_s, parts.settings.queue_limit_s)
        excluded: set[str] = set()
        last_retry: Retry | None = None
        try:
            if not self._served():
                await parts.cold.check(dreq.model, queue_limit)
            self.revisions = parts.canaries.allowed(dreq, parts.fleet.snapshot())
        except LlmfleetError as exc:
            self.outcome = exc.code or "unavailable"
            return await self._fail_before_output(exc)
        self.prefix = await self._prefix_matches()
        budget = RetryBudget()
        while budget.left():
            elapsed = parts.monotonic() - self._t0
            remaining = queue_budget(queue_limit, elapsed, retrying=bool(excluded))
            queued_at = parts.monotonic()
            try:
                node = await parts.queues.acquire(
                    self._pick(excluded), remaining, self._retry_hint, self.share
                )
            except LlmfleetError as exc:
                self.queued_s += parts.monotonic() - queued_at
                if exc.code == STOPPING and budget.attempts == 0:
                    self.outcome = STOPPING  # nothing ran: the gateway sends it to another replica
                    return refuse_dispatch(dreq.request_id)
                if exc.code == STOPPING:
                    exc = self._exhausted(last_retry)
                self.outcome = exc.code or "unavailable"
                return await self._fail_before_output(exc)
            self.queued_s += parts.monotonic() - queued_at
            if not excluded:  # the request's first pick (a retry is not another lookup)
                parts.metrics.prefix_picks.labels(dreq.model, prefix_outcome(self.prefix, node.node_id)).inc()
            if self.out.gateway_gone():
                await shielded(parts.fleet.release_slot(node.node_id, dreq.request_id), CLEANUP_S, "release")
                self.outcome = "gateway_gone"
                await self._cancel_reservation()
                return web.Response(status=499)
            result = await self._attempt(node)
            if not isinstance(result, Retry):
                return result
            last_retry = result
            excluded.add(node.node_id)
            budget.spend(reached=result is not Retry.UNREACHABLE)
            if budget.left():
                parts.metrics.retries.labels(model=dreq.model, reason=result.value).inc()
                event("dispatch_retry", request_id=dreq.request_id, node_id=node.node_id, reason=result.value)
        self.outcome = f"failed_{last_retry}"
        return await self._fail_before_output(self._exhausted(last_retry))

    def _pick(self, excluded: set[str]) -> PickRequest:
        dreq, settings = self.dreq, self.parts.settings
        return PickRequest(
            dreq.model,
            dreq.request_id,
            frozenset(excluded),
            settings.kv_cache_max,
            budget=dreq.budget,
            resumable=self.out.sent is not None,
            reserve_fraction=(
                settings.batch_reserve_fraction if dreq.priority_class is PriorityClass.BATCH else 0.0
            ),
            prefix=self.prefix,
            prefix_weights=self.weights,
            revisions=self.revisions,
        )

    async def _prefix_matches(self) -> dict[str, int]:
        """Which nodes hold how much of this request's conversation prefix (one Redis round trip)."""
        if self.weights.weight <= 0 or self.dreq.endpoint != "chat":
            return {}  # only a chat's conversation prefix is indexed
        body = self.dreq.body
        keys = lookup_keys(chat_messages(body), body.get("tools"), team_scope(self.dreq.team_id))
        conns = {n.node_id: n.conn for n in self.parts.fleet.snapshot()}
        try:
            async with asyncio.timeout(PREFIX_LOOKUP_S):
                return await self.parts.prefix_store.matches(self.dreq.model, keys, conns)
        except (RedisError, OSError, TimeoutError):
            self.parts.metrics.prefix_store_errors.inc()
            return {}  # prefix routing is an optimisation: the pick goes on by load

    def _exhausted(self, last_retry: Retry | None) -> LlmfleetError:
        """The error of a request whose every attempt failed before output."""
        if last_retry is Retry.FIRST_TOKEN_TIMEOUT:
            return UpstreamFailed(
                f"no first token within {self.dreq.deadlines.first_token_s:g} s", code="timeout"
            )
        return Unavailable(f"the node failed the request ({last_retry})", retry_after=self._retry_hint())

    def _served(self) -> bool:
        """A node of the model is in the fleet (else: a cold start, `apps/orchestrator/coldstart.py`)."""
        model = self.dreq.model
        if any(model in n.models for n in self.parts.fleet.snapshot()):
            self.parts.cold.served(model)
            return True
        return False

    def _retry_hint(self) -> float:
        serving = any(self.dreq.model in n.models for n in self.parts.fleet.snapshot())
        # No node serves the model at all: a scale-from-zero start takes minutes, not seconds.
        return 5.0 if serving else 30.0

    async def _attempt(self, node: NodeView) -> web.StreamResponse | Retry:
        parts, dreq = self.parts, self.dreq
        stream = RequestStream(dreq.request_id, node.node_id, parts.settings.relay_queue_events)
        pinned = dreq.revision is not None
        self.probe = probe = parts.canaries.probe(dreq.model, node.revisions.get(dreq.model), pinned=pinned)
        try:
            if not await parts.routing.start(node, assignment(dreq), stream):
                return Retry.UNREACHABLE
            first = await stream.next(dreq.deadlines.first_token_s)
            if first is None:
                probe.failed()
                await shielded(parts.routing.cancel(node.node_id, dreq.request_id), CLEANUP_S, "cancel")
                return Retry.FIRST_TOKEN_TIMEOUT
            if isinstance(first, LostEv):
                probe.failed()
                return Retry.NODE_LOST
            if isinstance(first, ErrorEv):
                frame = first.frame
                if frame.chunks_sent == 0 and frame.status >= 500:
                    probe.failed()
                    return Retry.NODE_ERROR
                self.outcome = f"engine_{frame.status}"
                exc = for_frame(frame.status, frame.error_type).exception(frame.message, frame.param)
                return await self._fail_before_output(exc)
            probe.first()
            response = await self.out.open(node.node_id, self.queued_s, node.revisions.get(dreq.model, ""))
            if isinstance(first, ChunkEv):
                await self.out.write_chunks(first, stream)  # also puts aiohttp's buffered headers out
                self.out.go_direct(stream)
                await self._stream(node, stream)
            else:
                await self._finish_ok(first)
            return response
        except (ConnectionResetError, ConnectionError):
            self.outcome = "gateway_disconnected"
            await shielded(parts.routing.cancel(node.node_id, dreq.request_id), CLEANUP_S, "cancel")
            return self.out.response or web.Response(status=499)
        except asyncio.CancelledError:
            # aiohttp cancels the handler when the gateway closes the connection
            # (`handler_cancellation=True`): stop the node; its `done` settles what ran.
            self.outcome = "gateway_disconnected"
            await shielded(parts.routing.cancel(node.node_id, dreq.request_id), CLEANUP_S, "cancel")
            raise
        finally:
            stream.sink = None
            stream.close()
            await shielded(parts.routing.finish(node.node_id, dreq.request_id, stream), CLEANUP_S, "finish")

    async def _stream(self, node: NodeView, stream: RequestStream) -> None:
        parts, dreq = self.parts, self.dreq
        while True:
            ev = await stream.next(dreq.deadlines.idle_s)
            if isinstance(ev, ChunkEv):
                await self.out.write_chunks(ev, stream)
                continue
            if isinstance(ev, DoneEv):
                await self._finish_ok(ev)
                return
            if ev is None:
                self.outcome = "idle_timeout"
                await shielded(parts.routing.cancel(node.node_id, dreq.request_id), CLEANUP_S, "cancel")
            elif isinstance(ev, LostEv) and ev.reason.value == "relay_overflow":
                await shielded(parts.routing.cancel(node.node_id, dreq.request_id), CLEANUP_S, "cancel")
            if self.out.sent is not None:
                reason = resume_reason(ev)
                if reason is not None:
                    resumed, ev = await self._resume(node, reason, ev)
                    if resumed:
                        return
                elif isinstance(ev, ErrorEv):
                    # Not a failure to resume from (a refusal mid-stream): its report was not
                    # settled by the socket's owner (the request could resume), so settle it here.
                    await self._settle_partial(ev.frame, node)
            await self._end_mid_stream(node, ev)
            return

    async def _end_mid_stream(self, node: NodeView, ev: ErrorEv | LostEv | None) -> None:
        """A stream that failed after output (and did not resume): one error event and [DONE]."""
        self.probe.failed()
        if isinstance(ev, ErrorEv):
            self.outcome = "node_error_mid_stream"
        elif isinstance(ev, LostEv):
            self.outcome = f"lost_mid_stream_{ev.reason.value}"
            await self._record_partial(node)
        await self.out.write(mid_stream_error(ev, self.dreq.deadlines.idle_s))

    async def _resume(
        self, node: NodeView, reason: Reason, ev: ErrorEv | LostEv | None
    ) -> tuple[bool, ErrorEv | LostEv | None]:
        """Continue on another node (at most once): (True, _) when the client's stream completed,
        else (False, how the stream ended: the second node's failure if it got that far)."""
        sent, self.out.sent = self.out.sent, None
        assert sent is not None
        error = ev.frame if isinstance(ev, ErrorEv) else None
        resumer = Resumer(self.parts, self.dreq, self.out.write, self._retry_hint, self.share)
        outcome = await resumer.run(sent, node, reason, error)
        event(
            "stream_resume",
            request_id=self.dreq.request_id,
            node_id=node.node_id,
            to_node=resumer.node_id,
            reason=reason.value,
            outcome=outcome.value,
        )
        if outcome is Outcome.COMPLETED:
            self.outcome = f"resumed_{reason.value}"
            return True, ev
        if resumer.assigned:
            return False, resumer.end
        if error is not None:
            # The first node's error frame was not settled (the request could resume): settle
            # what it reported now, as for any mid-stream failure.
            await self._settle_partial(error, node)
        return False, ev

    async def _settle_partial(self, error: Error, node: NodeView) -> None:
        # Held against the events this relay wrote, as the settle script holds a `done`
        # (apps/orchestrator/tolerance.py); the socket's owner flagged a disagreement already.
        completion = self.parts.settings.usage_tolerance.settled(error.completion_tokens, self.out.chunks)
        prompt, completion = self.dreq.budget.clamp(Usage(error.prompt_tokens, completion)).usage
        rid, revision = self.dreq.request_id, node.revisions.get(self.dreq.model) or None
        settle = self.parts.settle(rid, prompt, completion, node_id=node.node_id, model_revision=revision)
        await shielded(settle, CLEANUP_S, "settle")

    async def _record_partial(self, node: NodeView) -> None:
        """What the sweeper bills if the node never reports (`sweeper.partial_usage`)."""
        revision = node.revisions.get(self.dreq.model, "")  # the sweeper reads "" as unknown
        record = {"node": node.node_id, "revision": revision, **partial_usage(self.dreq, self.out.chunks)}
        redis = self.parts.redis
        ttl = self.parts.settings.done_record_ttl_s
        await shielded(
            redis.set(keys.partial_key(self.dreq.request_id), json.dumps(record), ex=ttl),
            CLEANUP_S,
            "partial",
        )

    async def _finish_ok(self, ev: DoneEv) -> None:
        # The fair queue charged the expected tokens at dispatch; the engine's usage corrects it.
        used = ev.frame.prompt_tokens + ev.frame.completion_tokens
        self.probe.done(ev.frame.completion_tokens)
        self.parts.shares.charge(self.dreq.model, self.share.team, self.share.correction(used))
        if self.dreq.client_wants_usage and ev.frame.usage_event:
            # One write for both: the usage event counts as a chunk, [DONE] does not.
            self.out.chunks += 1
            await self.out.write(sse_event(ev.frame.usage_event.encode()) + SSE_DONE, count=False)
        else:
            await self.out.write(SSE_DONE)

    async def _fail_before_output(self, exc: LlmfleetError) -> web.StreamResponse:
        await self._cancel_reservation()
        response = error_response(exc, self.dreq.request_id)
        response.headers[QUEUE_WAIT_HEADER] = f"{self.queued_s:.6f}"
        return response

    async def _cancel_reservation(self) -> None:
        # Nothing ran: the reservation must not wait for the sweeper (idempotent: the
        # gateway may cancel it too).
        await shielded(self.parts.ledger.cancel(self.dreq.request_id), CLEANUP_S, "ledger_cancel")
