"""`GuardrailStore` against real PostgreSQL (migration 0016): get, put, delete, a team that does not exist,
the policy going with its team, the table holding objects only, and the request path's cache (one query
per team at a time, the TTL, a save seen at once by the replica that made it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from apps.core.errors import NotFound, Unavailable
from apps.core.guardrails.policy import parse_policy
from apps.core.guardrails.store import GuardrailStore
from apps.core.ledger.teams import TeamStore

pytestmark = pytest.mark.timeout(60)

POLICY = parse_policy(
    {
        "input": [{"detector": "mrn", "action": "block"}],
        "output": [{"detector": "ssn", "action": "redact"}],
        "patterns": [{"name": "mrn", "pattern": "MRN[0-9]{6}"}],
    }
)
OTHER = parse_policy({"output": [{"detector": "email", "action": "flag"}]})


@pytest.fixture
async def pool(migrated_db_url: str) -> AsyncIterator[AsyncConnectionPool]:
    async with AsyncConnectionPool(migrated_db_url, min_size=1, max_size=4) as p:
        yield p


async def test_put_get_delete(pool: AsyncConnectionPool) -> None:
    team = await TeamStore(pool).create_team("ml")
    store = GuardrailStore(pool)
    assert await store.get(team.id) is None
    saved = await store.put(team.id, POLICY)
    got = await store.get(team.id)
    assert got is not None
    assert got.policy == POLICY
    assert got.updated_at == saved.updated_at
    assert got.as_json()["policy"]["patterns"] == [{"name": "mrn", "pattern": "MRN[0-9]{6}"}]
    replaced = await store.put(team.id, OTHER)
    assert replaced.updated_at >= saved.updated_at
    assert (await store.get(team.id)) is not None
    assert await store.delete(team.id) is True
    assert await store.delete(team.id) is False
    assert await store.get(team.id) is None


async def test_a_team_that_does_not_exist_is_not_found(pool: AsyncConnectionPool) -> None:
    store = GuardrailStore(pool)
    calls = (lambda: store.get(999), lambda: store.put(999, POLICY), lambda: store.delete(999))
    for call in calls:
        with pytest.raises(NotFound) as caught:
            await call()
        assert (caught.value.code, caught.value.param) == ("team_not_found", "team_id")


async def test_a_policy_goes_with_its_team_and_only_objects_are_stored(pool: AsyncConnectionPool) -> None:
    team = await TeamStore(pool).create_team("gone")
    await GuardrailStore(pool).put(team.id, POLICY)
    with pytest.raises(psycopg.errors.CheckViolation):
        async with pool.connection() as conn:
            await conn.execute(
                "UPDATE guardrail_policies SET policy = '[]'::jsonb WHERE team_id = %s", (team.id,)
            )
    async with pool.connection() as conn:
        await conn.execute("DELETE FROM teams WHERE id = %s", (team.id,))
        cur = await conn.execute("SELECT count(*) FROM guardrail_policies")
        assert await cur.fetchone() == (0,)


async def test_the_request_path_reads_a_compiled_policy_through_a_short_cache(
    pool: AsyncConnectionPool,
) -> None:
    clock = [100.0]
    team = await TeamStore(pool).create_team("cached")
    replica = GuardrailStore(pool, cache_ttl_s=4.0, monotonic=lambda: clock[0])
    admin = GuardrailStore(pool)
    assert await replica.compiled(team.id) is None  # no policy: cached too
    await admin.put(team.id, POLICY)
    assert await replica.compiled(team.id) is None
    assert replica.db_lookups == 1
    clock[0] += 4.5  # past the TTL: the other replica's save is seen
    found = await asyncio.gather(*(replica.compiled(team.id) for _ in range(20)))
    assert replica.db_lookups == 2  # concurrent misses share one query
    first = found[0]
    assert first is not None
    assert all(f is first for f in found)
    assert [(c.name, c.action) for c in first.input] == [("mrn", "block")]
    await replica.put(team.id, OTHER)  # this replica's own save applies at once
    after = await replica.compiled(team.id)
    assert after is not None
    assert [c.name for c in after.output] == ["email"]
    await replica.delete(team.id)
    assert await replica.compiled(team.id) is None


async def test_a_stored_policy_that_no_longer_validates_is_a_503_not_a_silent_pass(
    pool: AsyncConnectionPool,
) -> None:
    team = await TeamStore(pool).create_team("stale")
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO guardrail_policies (team_id, policy) VALUES (%s, %s)",
            (team.id, Jsonb({"input": [{"detector": "gone", "action": "block"}]})),
        )
    with pytest.raises(Unavailable) as caught:
        await GuardrailStore(pool).compiled(team.id)
    assert caught.value.code == "guardrail_policy_invalid"
