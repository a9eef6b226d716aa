"""`Ledger` over PostgreSQL (psycopg 3 async + pool): reserve, settle, cancel, sweep.

Reserve is one statement: `UPDATE teams SET reserved += estimate WHERE balance - reserved >=
estimate` and the ledger insert in a CTE. `teams.reserved_microcredits` is the sum of the
team's open reservations, changed in the same transaction as every reserve/settle/cancel; the
UPDATE's condition is re-evaluated under the team's row lock, so two concurrent reservations
cannot both pass the `balance - open reservations >= estimate` check. The row stores
the model's prices at reserve time, so settle needs no spec and a price change never
re-prices a request already admitted.

Settle is `UPDATE ... WHERE request_id = ? AND status = 'reserved'` plus the debit in
the same transaction; a retried settle finds no `reserved` row and is a no-op. The tokens come
capped already (`apps/core/budget.py` `Budget.clamp`, the settle script); the cost is held at the
money reserved (a money ceiling, the reservation's own invariant, not a second token cap: a
request without a known budget, from an older gateway, is bounded by it too), so no settle can
bill more than was reserved. The debit is
`LEAST(capped cost, balance)`: the balance covers every open reservation, so this only falls
short when an admin debit ate into reserved money; the shortfall is then recorded in
`uncharged_microcredits` (a write-off, counted by the metric
`llmfleet_ledger_writeoff_microcredits_total`, which alerts) instead of driving the balance
negative, and `cost_microcredits` is what was actually debited, so
`balance == credits - sum(settled cost)` always holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from psycopg_pool import AsyncConnectionPool

from apps.core.errors import DuplicateRequestId, InsufficientBalance, NotFound
from apps.core.ledger.api import Reservation, SettleOutcome, SettleResult
from apps.core.spec import Prices
from apps.core.stores import postgres_boundary


def cost_microcredits(
    prompt_tokens: int, completion_tokens: int, prompt_price: int, completion_price: int
) -> int:
    """Integer microcredits, rounded up (a partial microcredit is charged as one)."""
    total = prompt_tokens * prompt_price + completion_tokens * completion_price
    return -(-total // 1_000_000)


_RESERVE = """
WITH claimed AS (
    UPDATE teams SET reserved_microcredits = reserved_microcredits + %(est)s
    WHERE id = %(team)s AND balance_microcredits - reserved_microcredits >= %(est)s
    RETURNING id
), inserted AS (
    INSERT INTO usage_ledger (request_id, team_id, key_id, model, prompt_price_per_million,
                              completion_price_per_million, cached_price_per_million,
                              estimated_cost_microcredits, quota_subject, cache)
    SELECT %(rid)s, id, %(key)s, %(model)s, %(pp)s, %(cp)s, %(kp)s, %(est)s, %(subject)s, %(cache)s FROM claimed
    RETURNING 1
)
SELECT t.balance_microcredits, t.reserved_microcredits, (SELECT count(*) FROM inserted)
FROM (SELECT 1) AS one LEFT JOIN teams t ON t.id = %(team)s
"""

# Settle exactly once, in one statement: the cost (rounded up like `cost_microcredits`) is charged
# up to the balance (the rest is recorded as uncharged: the balance never goes negative), the
# reservation is released, the row becomes `settled`. No row back: unknown request; `final`:
# it was settled or cancelled already (by this statement's snapshot or a concurrent one).
_SETTLE = """
WITH r AS (
    SELECT team_id, estimated_cost_microcredits AS est,
           LEAST(((%(p)s::bigint - %(k)s) * prompt_price_per_million
                  + %(k)s::bigint * COALESCE(cached_price_per_million, prompt_price_per_million)
                  + %(c)s::bigint * completion_price_per_million
                  + 999999) / 1000000, estimated_cost_microcredits) AS cost
    FROM usage_ledger WHERE request_id = %(rid)s AND status = 'reserved'
    FOR UPDATE
), t AS (
    SELECT teams.id, r.est, r.cost, LEAST(r.cost, teams.balance_microcredits) AS charged
    FROM teams JOIN r ON teams.id = r.team_id
    FOR UPDATE OF teams
), debited AS (
    UPDATE teams SET balance_microcredits = teams.balance_microcredits - t.charged,
                     reserved_microcredits = teams.reserved_microcredits - t.est
    FROM t WHERE teams.id = t.id
    RETURNING 1
), settled AS (
    UPDATE usage_ledger SET status = 'settled', prompt_tokens = %(p)s, completion_tokens = %(c)s,
           cached_prompt_tokens = %(k)s, node_id = %(node)s, model_revision = %(rev)s,
           cost_microcredits = t.charged, uncharged_microcredits = t.cost - t.charged, finalized_at = now()
    FROM t WHERE usage_ledger.request_id = %(rid)s
    RETURNING usage_ledger.team_id, usage_ledger.key_id, usage_ledger.model, t.charged,
              t.cost - t.charged AS written_off, usage_ledger.quota_subject
)
SELECT 'settled', team_id, key_id, model, charged, written_off, quota_subject FROM settled
UNION ALL
SELECT 'final', team_id, key_id, model, 0, 0, quota_subject FROM usage_ledger
WHERE request_id = %(rid)s AND NOT EXISTS (SELECT 1 FROM settled)
"""


# A resumed stream's settle also records its second node's prefill (migration 0008); only that
# statement names the column, so a settle of any other request runs on a schema without it.
_SETTLE_RESUMED = _SETTLE.replace(
    "uncharged_microcredits = t.cost - t.charged, finalized_at = now()",
    "uncharged_microcredits = t.cost - t.charged, finalized_at = now(), resume_prompt_tokens = %(r)s",
)
assert _SETTLE_RESUMED != _SETTLE


_CANCEL = """
WITH done AS (
    UPDATE usage_ledger SET status = 'cancelled', finalized_at = now()
    WHERE request_id = %s AND status = 'reserved'
    RETURNING team_id, estimated_cost_microcredits
), released AS (
    UPDATE teams SET reserved_microcredits = reserved_microcredits - done.estimated_cost_microcredits
    FROM done WHERE teams.id = done.team_id
    RETURNING 1
)
SELECT count(*) FROM released
"""


class PgLedger:
    def __init__(self, pool: AsyncConnectionPool, prices: Mapping[str, Prices] | None = None) -> None:
        self._pool = pool
        self._prices = dict(prices or {})

    def _prices_of(self, model: str, cache: str | None) -> tuple[int, int, int]:
        """(prompt, completion, cached prompt) prices per million: a cache hit's tokens all at its price."""
        prices = self._prices.get(model)
        if prices is None:
            raise NotFound(f"The model `{model}` does not exist.", param="model")
        if cache == "hit":
            return prices.cache_hit, prices.cache_hit, prices.cache_hit
        return (
            prices.prompt_per_million_microcredits,
            prices.completion_per_million_microcredits,
            prices.cached_prompt,
        )

    def estimate(
        self, model: str, estimated_prompt_tokens: int, max_tokens: int, cache: str | None = None
    ) -> int:
        prompt, completion, _ = self._prices_of(model, cache)
        return cost_microcredits(estimated_prompt_tokens, max_tokens, prompt, completion)

    @postgres_boundary(unique_violation=DuplicateRequestId)
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
        estimate = self.estimate(model, estimated_prompt_tokens, max_tokens, cache)
        prompt, completion, cached = self._prices_of(model, cache)
        params = {
            "team": team_id,
            "est": estimate,
            "rid": request_id,
            "key": key_id,
            "subject": quota_subject,
            "model": model,
            "pp": prompt,
            "cp": completion,
            "kp": cached,
            "cache": cache,
        }
        async with self._pool.connection() as conn:
            # One statement, one round trip: the UPDATE's condition is re-checked under the team's row
            # lock, so concurrent reservations of one team serialise on it and can never overdraw.
            cur = await conn.execute(_RESERVE, params)
            row = await cur.fetchone()
        if row is None or row[0] is None:
            raise NotFound(f"team {team_id} does not exist", param="team", code="team_not_found")
        if not row[2]:
            available = max(int(row[0]) - int(row[1]), 0)
            raise InsufficientBalance(
                f"Insufficient balance: this request may cost up to {estimate} microcredits, available {available}."
            )
        return Reservation(request_id, team_id, key_id, model, estimate)

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
        prompt_tokens, completion_tokens = max(prompt_tokens, 0), max(completion_tokens, 0)
        params = {
            "rid": request_id,
            "p": prompt_tokens,
            "c": completion_tokens,
            "k": min(max(cached_prompt_tokens, 0), prompt_tokens),  # never more than the prompt
            "r": max(resume_prompt_tokens, 0),
            "node": node_id or None,
            "rev": model_revision or None,
        }
        async with self._pool.connection() as conn:
            # One statement, so one transaction by itself (one round trip on an autocommit connection):
            # lock the reserved row, then the team's row, debit, finalise. A concurrent settle of the
            # same request waits for the row lock and then finds it no longer `reserved` (PostgreSQL
            # re-checks the condition on the new version).
            cur = await conn.execute(_SETTLE_RESUMED if resume_prompt_tokens > 0 else _SETTLE, params)
            row = await cur.fetchone()
        if row is None:
            return SettleResult(SettleOutcome.UNKNOWN, request_id)
        outcome, team_id, key_id, model, charged, written_off, subject = row
        if outcome != "settled":
            return SettleResult(
                SettleOutcome.ALREADY_FINAL, request_id, team_id, key_id, model, quota_subject=subject
            )
        return SettleResult(
            SettleOutcome.SETTLED,
            request_id,
            team_id,
            key_id,
            model,
            prompt_tokens,
            completion_tokens,
            int(charged),
            int(written_off),
            subject,
        )

    @postgres_boundary()
    async def cancel(self, request_id: str) -> bool:
        async with self._pool.connection() as conn:
            cur = await conn.execute(_CANCEL, (request_id,))
            row = await cur.fetchone()
            return bool(row and row[0])

    async def stale_reservations(self, older_than: datetime, limit: int = 500) -> list[str]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT request_id FROM usage_ledger WHERE status = 'reserved' AND created_at < %s "
                "ORDER BY created_at LIMIT %s",
                (older_than, limit),
            )
            return [str(r[0]) for r in await cur.fetchall()]

    async def open_reservations(self) -> int:
        async with self._pool.connection() as conn:
            cur = await conn.execute("SELECT count(*) FROM usage_ledger WHERE status = 'reserved'")
            row = await cur.fetchone()
            return int(row[0]) if row else 0
