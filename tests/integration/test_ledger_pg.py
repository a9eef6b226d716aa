"""PgLedger against real PostgreSQL: two-phase semantics and the money invariants."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg_pool import AsyncConnectionPool

from apps.core.db.migrate import migrate, migrate_sync
from apps.core.errors import InsufficientBalance
from apps.core.ledger.api import SettleOutcome
from apps.core.ledger.pg import PgLedger, cost_microcredits
from apps.core.ledger.teams import TeamStore
from apps.core.spec import Prices

Env = tuple[PgLedger, TeamStore, AsyncConnectionPool]
PRICES = {
    "m": Prices(prompt_per_million_microcredits=1_000_000, completion_per_million_microcredits=2_000_000)
}


async def scalar(pool: AsyncConnectionPool, sql: str, *params: object) -> int:
    async with pool.connection() as conn:
        row = await (await conn.execute(sql.encode(), params)).fetchone()
    assert row is not None
    return int(row[0])


async def invariants(pool: AsyncConnectionPool, team_id: int) -> tuple[int, int]:
    """balance == credits - settled costs >= 0, and the team's reserved column == its open reservations."""
    bal = await scalar(pool, "SELECT balance_microcredits FROM teams WHERE id=%s", team_id)
    credits = await scalar(
        pool, "SELECT COALESCE(SUM(amount_microcredits),0) FROM credit_entries WHERE team_id=%s", team_id
    )
    settled = await scalar(
        pool,
        "SELECT COALESCE(SUM(cost_microcredits),0) FROM usage_ledger WHERE team_id=%s AND status='settled'",
        team_id,
    )
    assert bal == credits - settled
    assert bal >= 0
    reserved_col = await scalar(pool, "SELECT reserved_microcredits FROM teams WHERE id=%s", team_id)
    open_sum = await scalar(
        pool,
        "SELECT COALESCE(SUM(estimated_cost_microcredits),0) FROM usage_ledger WHERE team_id=%s AND status='reserved'",
        team_id,
    )
    assert reserved_col == open_sum
    return int(bal), int(settled)


@pytest.fixture
async def ledger(migrated_db_url: str) -> AsyncIterator[Env]:
    async with AsyncConnectionPool(migrated_db_url, min_size=1, max_size=30) as pool:
        yield PgLedger(pool, PRICES), TeamStore(pool), pool


async def test_migrations_are_idempotent_and_concurrent_safe(fresh_db_url: str) -> None:
    results = await asyncio.gather(*(migrate(fresh_db_url) for _ in range(4)))
    applied = [name for r in results for name in r]
    assert "0001_ledger.sql" in applied
    assert len(applied) == len(set(applied))
    assert migrate_sync(fresh_db_url) == []


async def test_reserve_settle_once_cancel(ledger: Env) -> None:
    lg, teams, pool = ledger
    team = await teams.create_team("t")
    await teams.add_credits(team.id, 1_000)
    res = await lg.reserve(
        request_id="r1", team_id=team.id, key_id=None, model="m", estimated_prompt_tokens=100, max_tokens=200
    )
    assert res.estimated_cost_microcredits == cost_microcredits(100, 200, 1_000_000, 2_000_000) == 500
    with pytest.raises(InsufficientBalance):
        await lg.reserve(
            request_id="r2",
            team_id=team.id,
            key_id=None,
            model="m",
            estimated_prompt_tokens=300,
            max_tokens=200,
        )
    first = await lg.settle("r1", 10, 20)
    again = await lg.settle("r1", 10, 20)
    assert first.outcome is SettleOutcome.SETTLED
    assert first.cost_microcredits == 50
    assert again.outcome is SettleOutcome.ALREADY_FINAL
    assert (await lg.settle("nope", 1, 1)).outcome is SettleOutcome.UNKNOWN
    await lg.reserve(
        request_id="r3", team_id=team.id, key_id=None, model="m", estimated_prompt_tokens=1, max_tokens=1
    )
    assert await lg.cancel("r3") is True
    assert await lg.cancel("r3") is False
    assert (await lg.settle("r3", 1, 1)).outcome is SettleOutcome.ALREADY_FINAL
    assert await invariants(pool, team.id) == (950, 50)
    old = datetime.now(UTC) + timedelta(seconds=1)
    await lg.reserve(
        request_id="r4", team_id=team.id, key_id=None, model="m", estimated_prompt_tokens=1, max_tokens=1
    )
    assert await lg.stale_reservations(old + timedelta(seconds=5)) == ["r4"]


async def test_a_resumed_request_records_its_re_prefill_as_platform_cost_never_charged(ledger: Env) -> None:
    lg, teams, pool = ledger
    team = await teams.create_team("t")
    await teams.add_credits(team.id, 1_000)
    await lg.reserve(
        request_id="r1", team_id=team.id, key_id=None, model="m", estimated_prompt_tokens=100, max_tokens=200
    )
    result = await lg.settle("r1", 10, 20, resume_prompt_tokens=30)
    assert result.cost_microcredits == 50  # the team's prompt once + what it received: as without resume
    assert await lg.settle("r1", 10, 20, resume_prompt_tokens=30) is not None
    row = await scalar(pool, "SELECT resume_prompt_tokens FROM usage_ledger WHERE request_id=%s", "r1")
    assert row == 30
    assert await invariants(pool, team.id) == (950, 50)


async def test_cached_prompt_tokens_cost_the_cached_price_and_never_more_than_the_prompt(ledger: Env) -> None:
    """Issue 29 item 4: the price recorded at reservation (a quarter of the prompt price unless the stack
    names one); cached tokens beyond the prompt are not believed; a row reserved before the cached price
    existed (NULL) charges its cached tokens the prompt price."""
    lg, teams, pool = ledger
    team = await teams.create_team("t")
    await teams.add_credits(team.id, 10_000)
    for rid in ("c1", "c2", "c3"):
        await lg.reserve(
            request_id=rid,
            team_id=team.id,
            key_id=None,
            model="m",
            estimated_prompt_tokens=1000,
            max_tokens=100,
        )
    one = await lg.settle("c1", 400, 10, cached_prompt_tokens=320)
    assert one.cost_microcredits == 80 + 80 + 20  # 80 uncached, 320 at 0.25, 10 completion at 2
    assert (
        await scalar(pool, "SELECT cached_prompt_tokens FROM usage_ledger WHERE request_id=%s", "c1") == 320
    )
    two = await lg.settle("c2", 400, 10, cached_prompt_tokens=9_999)  # more than the prompt: all of it cached
    assert two.cost_microcredits == 100 + 20
    async with pool.connection() as conn:
        await conn.execute("UPDATE usage_ledger SET cached_price_per_million = NULL WHERE request_id = 'c3'")
    three = await lg.settle("c3", 400, 10, cached_prompt_tokens=320)
    assert three.cost_microcredits == 400 + 20  # as before the migration
    assert await invariants(pool, team.id) == (10_000 - 180 - 120 - 420, 720)


@pytest.mark.parametrize(
    ("prompt", "completion"), [(0, 0), (1, 0), (0, 1), (7, 13), (999_999, 1), (12_345, 67_890)]
)
async def test_settle_cost_is_rounded_up_like_cost_microcredits(
    ledger: Env, prompt: int, completion: int
) -> None:
    """The settle statement computes the cost in SQL; it must match the Python rule to the microcredit."""
    _, teams, pool = ledger
    odd = PgLedger(
        pool, {"odd": Prices(prompt_per_million_microcredits=3, completion_per_million_microcredits=7)}
    )
    team = await teams.create_team("t")
    await teams.add_credits(team.id, 10**12)
    await odd.reserve(
        request_id="r",
        team_id=team.id,
        key_id=None,
        model="odd",
        estimated_prompt_tokens=10**6,
        max_tokens=10**5,
    )
    result = await odd.settle("r", prompt, completion)
    assert result.outcome is SettleOutcome.SETTLED
    assert result.cost_microcredits == cost_microcredits(prompt, completion, 3, 7)
    assert (result.prompt_tokens, result.completion_tokens) == (prompt, completion)
    assert await invariants(pool, team.id) == (10**12 - result.cost_microcredits, result.cost_microcredits)


async def test_settle_above_the_reservation_is_capped_at_it_and_writes_nothing_off(ledger: Env) -> None:
    """The reservation is the request's worst case: a report above it is billed as the worst case
    (on main it was billed up to the whole balance and the rest written off)."""
    lg, teams, pool = ledger
    team = await teams.create_team("t")
    await teams.add_credits(team.id, 10)
    await lg.reserve(
        request_id="r", team_id=team.id, key_id=None, model="m", estimated_prompt_tokens=1, max_tokens=1
    )  # 1 x 1 + 1 x 2 = 3 microcredits
    result = await lg.settle("r", 1000, 1000)  # far more than reserved
    assert result.cost_microcredits == 3
    assert result.written_off_microcredits == 0
    assert await invariants(pool, team.id) == (7, 3)


async def test_a_shortfall_after_an_admin_debit_is_reported_as_written_off(ledger: Env) -> None:
    lg, teams, pool = ledger
    team = await teams.create_team("t")
    await teams.add_credits(team.id, 10)
    await lg.reserve(
        request_id="r", team_id=team.id, key_id=None, model="m", estimated_prompt_tokens=2, max_tokens=4
    )  # 10 microcredits: the whole balance
    await teams.add_credits(team.id, -8)  # an admin debit eats into the reserved money
    result = await lg.settle("r", 2, 4)
    assert (result.cost_microcredits, result.written_off_microcredits) == (2, 8)
    assert await invariants(pool, team.id) == (0, 2)


async def test_concurrent_reservations_never_overdraw(ledger: Env) -> None:
    lg, teams, pool = ledger
    team = await teams.create_team("t")
    await teams.add_credits(team.id, 10_000)  # 20 reservations of 500 fit exactly

    async def one(i: int) -> bool:
        try:
            await lg.reserve(
                request_id=f"c{i}",
                team_id=team.id,
                key_id=None,
                model="m",
                estimated_prompt_tokens=100,
                max_tokens=200,
            )
        except InsufficientBalance:
            return False
        await lg.settle(f"c{i}", 100, 200)
        return True

    results = await asyncio.gather(*(one(i) for i in range(40)))
    assert sum(results) == 20
    assert await invariants(pool, team.id) == (0, 10_000)

    # Concurrent retried settles of one request debit once.
    await teams.add_credits(team.id, 500)
    await lg.reserve(
        request_id="dup", team_id=team.id, key_id=None, model="m", estimated_prompt_tokens=100, max_tokens=200
    )
    outcomes = await asyncio.gather(*(lg.settle("dup", 100, 200) for _ in range(10)))
    assert [o.outcome for o in outcomes].count(SettleOutcome.SETTLED) == 1
    assert await invariants(pool, team.id) == (0, 10_500)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.integers(0, 300), st.integers(1, 300)),
        st.tuples(st.just("settle"), st.integers(0, 400), st.integers(0, 400)),
        st.tuples(st.just("cancel"), st.just(0), st.just(0)),
        st.tuples(st.just("credit"), st.integers(1, 2000), st.just(0)),
    ),
    max_size=25,
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequence=ops)
async def test_invariants_hold_for_any_sequence(ledger: Env, sequence: list[tuple[str, int, int]]) -> None:
    lg, teams, pool = ledger
    team = await teams.create_team(f"h{uuid.uuid4().hex[:8]}")
    open_ids: list[str] = []
    for op, a, b in sequence:
        if op == "reserve":
            rid = uuid.uuid4().hex
            try:
                await lg.reserve(
                    request_id=rid,
                    team_id=team.id,
                    key_id=None,
                    model="m",
                    estimated_prompt_tokens=a,
                    max_tokens=b,
                )
                open_ids.append(rid)
            except InsufficientBalance:
                pass
        elif op == "settle" and open_ids:
            assert (await lg.settle(open_ids[0], a, b)).outcome is SettleOutcome.SETTLED
            assert (await lg.settle(open_ids.pop(0), a, b)).outcome is SettleOutcome.ALREADY_FINAL
        elif op == "cancel" and open_ids:
            assert await lg.cancel(open_ids.pop()) is True
        elif op == "credit":
            await teams.add_credits(team.id, a)
        await invariants(pool, team.id)
    # Every reservation made fit the balance at its time and is counted in `reserved_microcredits`.
    await invariants(pool, team.id)
