"""In-memory `Ledger` for unit tests (same transitions as `PgLedger`: reserved -> settled | cancelled).

`settle_calls` counts every settle attempt so tests can assert "settled once, not zero
times and not twice"; `created_at` comes from an injected clock for the sweeper.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from apps.core.ledger.api import Reservation, ReservationStatus, SettleOutcome, SettleResult


@dataclass
class Row:
    request_id: str
    team_id: int
    key_id: int | None
    model: str
    estimate: int
    created_at: datetime
    status: ReservationStatus = ReservationStatus.RESERVED
    prompt_tokens: int = 0
    completion_tokens: int = 0
    quota_subject: str | None = None


@dataclass
class FakeLedger:
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    rows: dict[str, Row] = field(default_factory=dict)
    settle_calls: list[tuple[str, int, int]] = field(default_factory=list)
    cancel_calls: list[str] = field(default_factory=list)
    resume_prompt_tokens: dict[str, int] = field(default_factory=dict)  # platform cost per request

    async def reserve(
        self,
        *,
        request_id: str,
        team_id: int,
        key_id: int | None,
        model: str,
        estimated_prompt_tokens: int,
        max_tokens: int,
        quota_subject: str | None = None,
    ) -> Reservation:
        estimate = estimated_prompt_tokens + max_tokens
        self.rows[request_id] = Row(
            request_id, team_id, key_id, model, estimate, self.clock(), quota_subject=quota_subject
        )
        return Reservation(request_id, team_id, key_id, model, estimate)

    def add(self, request_id: str, model: str = "m", created_at: datetime | None = None) -> None:
        self.rows[request_id] = Row(request_id, 1, 1, model, 100, created_at or self.clock())

    async def settle(
        self,
        request_id: str,
        prompt_tokens: int,
        completion_tokens: int,
        *,
        resume_prompt_tokens: int = 0,
        cached_prompt_tokens: int = 0,
    ) -> SettleResult:
        self.settle_calls.append((request_id, prompt_tokens, completion_tokens))
        if resume_prompt_tokens:
            self.resume_prompt_tokens[request_id] = resume_prompt_tokens
        row = self.rows.get(request_id)
        if row is None:
            return SettleResult(SettleOutcome.UNKNOWN, request_id)
        if row.status is not ReservationStatus.RESERVED:
            return SettleResult(
                SettleOutcome.ALREADY_FINAL,
                request_id,
                row.team_id,
                row.key_id,
                row.model,
                quota_subject=row.quota_subject,
            )
        row.status = ReservationStatus.SETTLED
        row.prompt_tokens, row.completion_tokens = prompt_tokens, completion_tokens
        return SettleResult(
            SettleOutcome.SETTLED,
            request_id,
            row.team_id,
            row.key_id,
            row.model,
            prompt_tokens,
            completion_tokens,
            prompt_tokens + completion_tokens,
            quota_subject=row.quota_subject,
        )

    async def cancel(self, request_id: str) -> bool:
        self.cancel_calls.append(request_id)
        row = self.rows.get(request_id)
        if row is None or row.status is not ReservationStatus.RESERVED:
            return False
        row.status = ReservationStatus.CANCELLED
        return True

    async def stale_reservations(self, older_than: datetime, limit: int = 500) -> list[str]:
        stale = [r.request_id for r in self.rows.values() if r.status is ReservationStatus.RESERVED]
        return [rid for rid in stale if self.rows[rid].created_at < older_than][:limit]

    def status(self, request_id: str) -> ReservationStatus | None:
        row = self.rows.get(request_id)
        return row.status if row else None
