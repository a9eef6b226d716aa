"""The ledger contract shared by the gateway (reserve, cancel) and the orchestrator
(settle, sweep). Implemented over PostgreSQL in `apps.core.ledger.pg`; unit tests use
`tests/fakes` implementations that pass the same contract suite.

Money is integer microcredits. States (docs/architecture.md, convention 6):

    reserved --settle--> settled      (exact usage from the engine; debits the team)
    reserved --cancel--> cancelled    (nothing ran, or the node never reported)

Both transitions are conditional on `status = 'reserved'`, so a retried settle or a
settle after cancel is a no-op that reports `ALREADY_FINAL`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol


class ReservationStatus(enum.StrEnum):
    RESERVED = "reserved"
    SETTLED = "settled"
    CANCELLED = "cancelled"


class SettleOutcome(enum.StrEnum):
    SETTLED = "settled"
    ALREADY_FINAL = "already_final"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Reservation:
    request_id: str
    team_id: int
    key_id: int | None
    model: str
    estimated_cost_microcredits: int


@dataclass(frozen=True)
class SettleResult:
    outcome: SettleOutcome
    request_id: str
    team_id: int | None = None
    key_id: int | None = None
    model: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_microcredits: int = 0
    written_off_microcredits: int = 0  # cost the balance could not cover (never, in normal operation)
    # Whose daily token quota counts this request (the admission's subject: a key id or
    # `jwt-<sub>`); None: the key id (a row reserved without one).
    quota_subject: str | None = None

    @property
    def tokens_subject(self) -> str | None:
        """The `tpd:{subject}:{day}` counter's subject, or None (nothing to count)."""
        if self.quota_subject:
            return self.quota_subject
        return str(self.key_id) if self.key_id is not None else None


class Ledger(Protocol):
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
        cache: str | None = None,
    ) -> Reservation:
        """Insert a `reserved` row; `InsufficientBalance` (402) if balance - open reservations < estimate.
        `quota_subject`: whose daily token quota the settle counts (`SettleResult.tokens_subject`).
        `cache`: the response cache's part (docs/response-cache.md): `hit` (every token at the model's
        cache price, settled by the gateway at once), `miss` (looked up, not found), None (not asked)."""
        ...

    async def settle(
        self,
        request_id: str,
        prompt_tokens: int,
        completion_tokens: int,
        *,
        resume_prompt_tokens: int = 0,
        cached_prompt_tokens: int = 0,
        node_id: str | None = None,
        model_revision: str | None = None,
    ) -> SettleResult:
        """Exactly once: `reserved -> settled` and debit the team in one transaction.
        `resume_prompt_tokens`: a resumed stream's re-prefill on its second node, recorded on the row
        as platform cost (never charged). `cached_prompt_tokens`: prompt tokens the engine found in its
        prefix cache, charged at the cached-input price recorded at reservation. `node_id` and
        `model_revision`: the audit trail, recorded on the row (None: not known)."""
        ...

    async def cancel(self, request_id: str) -> bool:
        """`reserved -> cancelled`; False if the row was already final or unknown."""
        ...

    async def stale_reservations(self, older_than: datetime, limit: int = 500) -> list[str]:
        """Request ids still `reserved` and created before `older_than` (for the sweeper)."""
        ...
