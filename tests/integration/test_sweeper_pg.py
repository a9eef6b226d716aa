"""The sweeper against real PostgreSQL rows and real Redis records (not a fake ledger): stale
reservations are settled from the done record, else the partial record, else cancelled; money and
the team's reserved total move exactly once; young and final rows are not touched; a second sweep
changes nothing."""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool
from redis.asyncio import Redis

from apps.core.identity.keys import KeyStore
from apps.core.ledger.pg import PgLedger, cost_microcredits
from apps.core.ledger.teams import TeamStore
from apps.core.metering import settle_usage
from apps.core.nodes import keys
from apps.core.spec import load_spec
from apps.orchestrator.metrics import Metrics
from apps.orchestrator.sweeper import Sweeper
from tests.utcdays import tokens_counted

MODEL = "llama-3.1-8b-instruct"
CREDITS = 10_000_000


@pytest.fixture
async def stores(migrated_db_url: str, redis_url: str) -> AsyncIterator[tuple[AsyncConnectionPool, Redis]]:
    pool = AsyncConnectionPool(
        migrated_db_url, min_size=1, max_size=4, open=False, kwargs={"autocommit": True}
    )
    await pool.open()
    redis = Redis.from_url(redis_url)
    try:
        yield pool, redis
    finally:
        await redis.aclose()
        await pool.close()


async def _rows(pool: AsyncConnectionPool) -> dict[str, tuple[Any, ...]]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT request_id, status::text, prompt_tokens, completion_tokens, cost_microcredits FROM usage_ledger"
        )
        return {str(r[0]): tuple(r[1:]) for r in await cur.fetchall()}


async def _team(pool: AsyncConnectionPool, team_id: int) -> tuple[int, int]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT balance_microcredits, reserved_microcredits FROM teams WHERE id = %s", (team_id,)
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def test_sweeper_settles_and_cancels_real_rows_exactly_once(
    stores: tuple[AsyncConnectionPool, Redis],
) -> None:
    started = datetime.now(UTC)
    pool, redis = stores
    spec = load_spec("dev")
    prices = spec.models[MODEL].prices
    ledger = PgLedger(pool, {n: m.prices for n, m in spec.models.items()})
    team = await TeamStore(pool).create_team("swept")
    await TeamStore(pool).add_credits(team.id, CREDITS)
    _, key = await KeyStore(pool, b"k").create(team=team.id)
    for rid in ("s-done", "s-partial", "s-none", "s-young", "s-final"):
        await ledger.reserve(
            request_id=rid,
            team_id=team.id,
            key_id=key.id,
            model=MODEL,
            estimated_prompt_tokens=50,
            max_tokens=20,
            quota_subject=str(key.id),
        )
    await ledger.settle("s-final", 5, 5)  # final before the sweep: never touched again
    async with pool.connection() as conn:  # everything but s-young is older than the horizon
        await conn.execute(
            "UPDATE usage_ledger SET created_at = now() - interval '1 hour' WHERE request_id <> 's-young'"
        )
    # What the settle script and the relay write: the node and the revision it served (the audit trail).
    done = {"node": "n-swept", "revision": "rev-7", "prompt_tokens": 12, "completion_tokens": 7}
    await redis.set(keys.done_key("s-done"), json.dumps(done))
    partial = {"node": "n-lost", "prompt_tokens": 0, "completion_tokens": 4}  # an older node: no revision
    await redis.set(keys.partial_key("s-partial"), json.dumps(partial))
    await redis.set(keys.done_key("s-final"), json.dumps({"prompt_tokens": 99, "completion_tokens": 99}))
    estimate = ledger.estimate(MODEL, 50, 20)
    before = await _team(pool, team.id)
    assert before == (
        CREDITS
        - cost_microcredits(
            5, 5, prices.prompt_per_million_microcredits, prices.completion_per_million_microcredits
        ),
        4 * estimate,
    )

    sweeper = Sweeper(
        redis,
        ledger,
        functools.partial(settle_usage, ledger, redis),
        Metrics([MODEL]),
        orchestrator_id="orch-sweep",
        max_request_s=900,
        interval_s=60,
    )
    assert await sweeper.sweep_once() == {"settled": 1, "settled_partial": 1, "cancelled": 1}

    def cost(p: int, c: int) -> int:
        return cost_microcredits(
            p, c, prices.prompt_per_million_microcredits, prices.completion_per_million_microcredits
        )

    rows = await _rows(pool)
    assert rows["s-done"] == ("settled", 12, 7, cost(12, 7))
    assert rows["s-partial"] == ("settled", 0, 4, cost(0, 4))
    assert rows["s-none"] == ("cancelled", 0, 0, 0)
    assert rows["s-young"] == ("reserved", 0, 0, 0)
    assert rows["s-final"] == ("settled", 5, 5, cost(5, 5))
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT request_id, node_id, model_revision FROM usage_ledger")
        audit = {str(r[0]): (r[1], r[2]) for r in await cur.fetchall()}
    assert audit["s-done"] == ("n-swept", "rev-7")
    assert audit["s-partial"] == ("n-lost", None)
    assert audit["s-none"] == (None, None)  # nothing ran
    balance, reserved = await _team(pool, team.id)
    assert balance == CREDITS - cost(5, 5) - cost(12, 7) - cost(0, 4)
    assert reserved == estimate  # only the young reservation is still open
    async with pool.connection() as conn:  # the ledger's invariant: balance = credits - settled cost
        cur = await conn.execute(
            "SELECT sum(cost_microcredits) FROM usage_ledger WHERE team_id = %s AND status = 'settled'",
            (team.id,),
        )
        row = await cur.fetchone()
    assert row is not None
    assert balance == CREDITS - int(row[0])
    # The sweeper's settles count against the key's day too (either side of midnight UTC).
    assert await tokens_counted(redis, key.id, started) == 12 + 7 + 4

    assert await sweeper.sweep_once() == {"settled": 0, "settled_partial": 0, "cancelled": 0}
    assert await _rows(pool) == rows
    assert await _team(pool, team.id) == (balance, reserved)


async def test_the_sweeper_bills_cached_tokens_as_the_settle_does(
    stores: tuple[AsyncConnectionPool, Redis],
) -> None:
    """A done record's cached tokens are billed at the cached-input price; a resumed stream's are
    not (its second node's cache saw the resume's prompt, platform cost), as in the settle."""
    pool, redis = stores
    spec = load_spec("dev")
    prices = spec.models[MODEL].prices
    ledger = PgLedger(pool, {n: m.prices for n, m in spec.models.items()})
    team = await TeamStore(pool).create_team("swept-cached")
    await TeamStore(pool).add_credits(team.id, CREDITS)
    for rid in ("c-plain", "c-resumed"):
        await ledger.reserve(
            request_id=rid, team_id=team.id, key_id=None, model=MODEL, estimated_prompt_tokens=50,
            max_tokens=20, quota_subject="jwt-swept",
        )  # fmt: skip
    async with pool.connection() as conn:
        await conn.execute("UPDATE usage_ledger SET created_at = now() - interval '1 hour'")
    plain = {"prompt_tokens": 40, "completion_tokens": 7, "cached_tokens": 32}
    resumed = {**plain, "resume_prompt_tokens": 45}
    await redis.set(keys.done_key("c-plain"), json.dumps(plain))
    await redis.set(keys.done_key("c-resumed"), json.dumps(resumed))
    sweeper = Sweeper(
        redis, ledger, functools.partial(settle_usage, ledger, redis), Metrics([MODEL]),
        orchestrator_id="orch-sweep-cached", max_request_s=900, interval_s=60,
    )  # fmt: skip
    assert await sweeper.sweep_once() == {"settled": 2, "settled_partial": 0, "cancelled": 0}
    pp, cp, kp = (
        prices.prompt_per_million_microcredits,
        prices.completion_per_million_microcredits,
        prices.cached_prompt,
    )
    assert kp < pp
    rows = await _rows(pool)
    assert rows["c-plain"] == ("settled", 40, 7, -(-(8 * pp + 32 * kp + 7 * cp) // 1_000_000))
    assert rows["c-resumed"] == ("settled", 40, 7, cost_microcredits(40, 7, pp, cp))
