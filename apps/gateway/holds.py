"""What a request holds while it runs, and its release: the stream slot and the counters of the Redis
admission (`apps.core.quota.admission`), the ledger reservation (`apps.core.ledger`), taken in order or
at once (`apps.gateway.speculation`: a key with headroom), and given back on every path out (`finish`,
idempotent). `apps.gateway.chat` decides when; this module owns how.
"""

from __future__ import annotations

import asyncio
import time

from apps.core.errors import (
    DuplicateRequestId,
    LlmfleetError,
    RateLimited,
    StoreUnavailable,
    Unavailable,
)
from apps.core.identity.principal import Principal
from apps.core.quota.admission import Verdict
from apps.gateway.deps import GatewayDeps
from apps.gateway.exchange import REFUSALS, Exchange, ratelimit_headers
from apps.gateway.metrics import GatewayMetrics
from apps.gateway.settings import GatewaySettings
from apps.gateway.speculation import Speculation
from apps.gateway.validate import InferenceRequest


class Holds:
    def __init__(self, settings: GatewaySettings, deps: GatewayDeps, metrics: GatewayMetrics) -> None:
        self._s = settings
        self._d = deps
        self._m = metrics
        self._speculation = Speculation()

    async def admit_and_reserve(
        self, chat: InferenceRequest, principal: Principal, team_id: int, ex: Exchange
    ) -> None:
        """The admission and the reservation: at once for a key with headroom, else in order."""
        subject, limits = principal.subject, principal.limits
        checks_at = time.monotonic()
        overlapped = self._speculation.begin(subject, limits)
        try:
            if overlapped:
                await self._overlapped(chat, principal, team_id, ex)
            else:
                await self.admit(principal, ex, chat.worst_case_tokens)
                await self.reserve(chat, principal, team_id, ex)
        except LlmfleetError as exc:
            self._count_ledger_refusal(exc, ex)
            raise
        finally:
            if overlapped:
                self._speculation.end(subject, limits)
            mode = "overlapped" if overlapped else "in_order"
            self._m.checks.labels(mode).observe(time.monotonic() - checks_at)

    async def _overlapped(
        self, chat: InferenceRequest, principal: Principal, team_id: int, ex: Exchange
    ) -> None:
        """Both checks at once; both always run to completion (what each took is in `ex`, so the
        cleanup can give it back). When both refuse, the admission's refusal is the answer."""
        # The reservation is the slower leg (a PostgreSQL commit): its task starts first, so its
        # statement is on the wire before the admission's Python work runs.
        reserve = asyncio.ensure_future(self.reserve(chat, principal, team_id, ex))
        admit = asyncio.ensure_future(self.admit(principal, ex, chat.worst_case_tokens))
        ex.pending = (admit, reserve)
        await asyncio.wait(ex.pending)  # cancelled here: `finish` waits for both first
        ex.pending = ()
        errors = [task.exception() for task in (admit, reserve)]
        if errors[0] is not None and ex.reserved:
            self._m.overlap_wasted.inc()
        for error in errors:
            if error is not None:
                raise error

    async def reserve(self, chat: InferenceRequest, principal: Principal, team_id: int, ex: Exchange) -> None:
        try:
            await self._d.ledger.reserve(
                request_id=ex.request_id,
                team_id=team_id,
                key_id=principal.key_id,
                model=chat.model,
                estimated_prompt_tokens=chat.estimated_prompt_tokens,
                max_tokens=chat.worst_case_completion_tokens,  # n x the effective max_tokens
                quota_subject=principal.subject,  # the settle counts tokens_per_day for it (JWTs too)
                **({"cache": "miss"} if ex.cache is not None else {}),
            )
        except DuplicateRequestId:
            raise
        except StoreUnavailable:
            self._m.pg_errors.inc()
            raise Unavailable(
                "The ledger is unavailable.", code="ledger_unavailable", retry_after=5
            ) from None
        except LlmfleetError as exc:
            ex.ledger_refusal = exc
            raise
        ex.reserved = True
        self._m.reservations_open.inc()

    async def admit(self, principal: Principal, ex: Exchange, worst_case_tokens: int) -> None:
        try:
            adm = await self._d.quota.admit(
                principal.subject, ex.request_id, principal.limits, self._d.clock(), worst_case_tokens
            )
        except StoreUnavailable:
            self._m.redis_errors.inc()
            if self._s.redis_fail_open:
                return
            self._m.rejections.labels("redis_unavailable").inc()
            raise Unavailable(
                "Quota store unavailable; request refused (fail closed).",
                code="redis_unavailable",
                retry_after=5,
            ) from None
        self._speculation.record(principal.subject, adm)
        if adm.verdict is Verdict.DUPLICATE:
            raise DuplicateRequestId()
        ex.headers.update(ratelimit_headers(adm))
        if not adm.admitted:
            reason, message = REFUSALS[adm.verdict]
            team = adm.limits.team
            limit = {
                Verdict.MAX_STREAMS: adm.limits.max_streams,
                Verdict.RPM: adm.limits.rpm,
                Verdict.TOKENS_PER_DAY: adm.limits.tokens_per_day,
                Verdict.TEAM_MAX_STREAMS: team.max_streams if team else None,
                Verdict.TEAM_TOKENS_PER_MINUTE: team.tokens_per_minute if team else None,
            }[adm.verdict]
            self._m.rejections.labels(reason).inc()
            raise RateLimited(message.format(limit), code=reason, retry_after=max(adm.retry_after_s, 1.0))
        ex.slot_held = True

    async def finish(self, ex: Exchange, *, cancel_reservation: bool) -> None:
        """Release what this request still holds; idempotent."""
        if ex.pending:
            await asyncio.wait(ex.pending)  # an admission or reservation still landing
            ex.pending = ()
        if ex.slot_held and ex.principal is not None:
            ex.slot_held = False
            forget = cancel_reservation and not ex.handed_over  # no settle will count these tokens
            try:
                await self._d.quota.release(
                    ex.principal.subject, ex.request_id, forget_tokens=forget, team_id=ex.principal.team_id
                )
            except StoreUnavailable:
                # The slot's lease expires on its own; count it and move on.
                self._m.redis_errors.inc()
        if ex.reserved and cancel_reservation:
            ex.reserved = False
            self._m.reservations_open.dec()
            try:
                await self._d.ledger.cancel(ex.request_id)
            except StoreUnavailable:
                self._m.pg_errors.inc()

    async def count_refusal(self, ex: Exchange, exc: LlmfleetError) -> None:
        """A 429 or 503 of a known team, for the console; never delays the answer by more than a
        moment and never when the store that counts is the one that failed."""
        team_id = ex.principal.team_id if ex.principal is not None else None
        if self._d.refusals is None or team_id is None or exc.status not in (429, 503):
            return
        if exc.code == "redis_unavailable":
            return
        try:
            async with asyncio.timeout(self._s.refusal_count_timeout_s):
                key_id = ex.principal.key_id if ex.principal is not None else None
                await self._d.refusals.count(team_id, key_id, exc.status, exc.code or "unknown")
        except (TimeoutError, StoreUnavailable):
            self._m.redis_errors.inc()

    async def reserve_counted(
        self, chat: InferenceRequest, principal: Principal, team_id: int, ex: Exchange
    ) -> None:
        """The reservation alone (the admission came first), its refusal counted."""
        try:
            await self.reserve(chat, principal, team_id, ex)
        except LlmfleetError as exc:
            self._count_ledger_refusal(exc, ex)
            raise

    def _count_ledger_refusal(self, exc: LlmfleetError, ex: Exchange) -> None:
        if exc is ex.ledger_refusal:  # not when the admission refused too: one reason per request
            self._m.rejections.labels(exc.code or "ledger").inc()
