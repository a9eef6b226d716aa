"""The orchestrator's ledger in its integration tests: the real `PgLedger` on the test database,
behind `settle_usage` as in production, recording what the orchestrator asked of it.

The calls (`settle_calls`, `cancel_calls`, `resume_prompt_tokens`) are what the tests hold the
orchestrator to ("settled once, with these tokens"); the rows, the money and the transitions are
PostgreSQL's (it replaced an in-memory ledger that mirrored `PgLedger` by hand).
"""

from __future__ import annotations

from datetime import datetime

from psycopg_pool import AsyncConnectionPool

from apps.core.ledger.api import ReservationStatus, SettleResult
from apps.core.ledger.pg import PgLedger
from apps.core.ledger.teams import TeamStore
from apps.core.spec import Prices

PRICES = Prices(prompt_per_million_microcredits=1_000_000, completion_per_million_microcredits=1_000_000)
CREDITS = 10**12  # the test team never runs out
ESTIMATE = (50, 50)  # a test reservation's prompt estimate and max tokens (`add`)


class RecordedLedger:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool
        self.pg = PgLedger(pool)  # settle, cancel and the sweep use the prices each row was reserved at
        self.team_id = 0  # `setup`
        self.settle_calls: list[tuple[str, int, int]] = []
        self.cancel_calls: list[str] = []
        self.resume_prompt_tokens: dict[str, int] = {}  # platform cost per request
        self.cached_prompt_tokens: dict[str, int] = {}

    async def setup(self) -> RecordedLedger:
        team = await TeamStore(self.pool).create_team("orchestrator-tests")
        await TeamStore(self.pool).add_credits(team.id, CREDITS)
        self.team_id = team.id
        return self

    # -- the `Ledger` the orchestrator uses --------------------------------------------------

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
        self.settle_calls.append((request_id, prompt_tokens, completion_tokens))
        if resume_prompt_tokens:
            self.resume_prompt_tokens[request_id] = resume_prompt_tokens
        if cached_prompt_tokens:
            self.cached_prompt_tokens[request_id] = cached_prompt_tokens
        return await self.pg.settle(
            request_id,
            prompt_tokens,
            completion_tokens,
            resume_prompt_tokens=resume_prompt_tokens,
            cached_prompt_tokens=cached_prompt_tokens,
            node_id=node_id,
            model_revision=model_revision,
        )

    async def cancel(self, request_id: str) -> bool:
        self.cancel_calls.append(request_id)
        return await self.pg.cancel(request_id)

    async def stale_reservations(self, older_than: datetime, limit: int = 500) -> list[str]:
        return await self.pg.stale_reservations(older_than, limit)

    # -- the tests' side ---------------------------------------------------------------------

    async def add(self, request_id: str, model: str = "m", created_at: datetime | None = None) -> None:
        """A reservation for the test team, as the gateway makes it (`created_at`: an older one,
        for the sweeper)."""
        prompt, max_tokens = ESTIMATE
        await PgLedger(self.pool, {model: PRICES}).reserve(
            request_id=request_id,
            team_id=self.team_id,
            key_id=None,
            model=model,
            estimated_prompt_tokens=prompt,
            max_tokens=max_tokens,
        )
        if created_at is not None:
            async with self.pool.connection() as conn:
                await conn.execute(
                    "UPDATE usage_ledger SET created_at = %s WHERE request_id = %s", (created_at, request_id)
                )

    async def status(self, request_id: str) -> ReservationStatus | None:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT status::text FROM usage_ledger WHERE request_id = %s", (request_id,)
            )
            row = await cur.fetchone()
        return ReservationStatus(row[0]) if row else None

    async def has(self, request_id: str, status: ReservationStatus) -> bool:
        return await self.status(request_id) is status

    async def completion_tokens(self, request_id: str) -> int:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT completion_tokens FROM usage_ledger WHERE request_id = %s", (request_id,)
            )
            row = await cur.fetchone()
        assert row is not None, f"{request_id} was never reserved"
        return int(row[0])
