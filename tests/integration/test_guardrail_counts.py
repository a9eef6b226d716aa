"""Guardrail decisions per team and UTC day in real Redis (`apps.core.guardrails.counts.DecisionCounts`):
what the console's panels read, what is written (fields only, never text), how long it is kept."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
import redis.asyncio as aioredis

from apps.core.errors import StoreUnavailable
from apps.core.guardrails.counts import ALL_TEAMS, KEEP_DAYS, DecisionCount, DecisionCounts, decisions_key
from apps.core.guardrails.decisions import Decision
from tests.integration.redis_client import SetClock, redis

__all__ = ["redis"]  # the fixture, imported for pytest

pytestmark = pytest.mark.timeout(30)

NOW = datetime(2026, 12, 10, 12, 0, tzinfo=UTC)
TODAY = NOW.date()


def redact(check: str, field: str = "messages.0.content") -> Decision:
    return Decision("input", check, "redact", field)


async def test_counts_by_team_direction_check_and_action_over_a_range_of_days(redis: aioredis.Redis) -> None:
    clock = SetClock(NOW)
    store = DecisionCounts(redis, clock)
    clock.now = NOW - timedelta(days=12)  # the month before, outside the week
    await store.count(7, [Decision("input", "ssn", "block", "messages.0.content")])
    clock.now = NOW - timedelta(days=3)
    await store.count(7, [redact("email"), Decision("output", "ssn", "block", "choices.0")])
    clock.now = NOW
    await store.count(7, [redact("email"), redact("email", "messages.1.content"), redact("member_id")])
    await store.count(7, [Decision("input", "guard_model", "flag", "messages")])
    await store.count(8, [redact("email")])  # another team
    await store.count(7, [])  # nothing decided: nothing written
    week = (TODAY - timedelta(days=6), TODAY + timedelta(days=1))
    assert await store.team(7, *week) == [
        DecisionCount("input", "email", "redact", 3),
        DecisionCount("input", "guard_model", "flag", 1),
        DecisionCount("input", "member_id", "redact", 1),
        DecisionCount("output", "ssn", "block", 1),
    ]
    assert await store.team(7, TODAY, TODAY + timedelta(days=1)) == [
        DecisionCount("input", "email", "redact", 2),
        DecisionCount("input", "guard_model", "flag", 1),
        DecisionCount("input", "member_id", "redact", 1),
    ]
    assert await store.team(9, *week) == []
    month = (TODAY - timedelta(days=29), TODAY + timedelta(days=1))  # across two months' hashes
    assert DecisionCount("input", "ssn", "block", 1) in await store.team(7, *month)
    assert len(await store.team(7, *month)) == 5
    assert await store.teams(*week) == [
        DecisionCount("input", "email", "redact", 3, team_id=7),
        DecisionCount("input", "guard_model", "flag", 1, team_id=7),
        DecisionCount("input", "member_id", "redact", 1, team_id=7),
        DecisionCount("output", "ssn", "block", 1, team_id=7),
        DecisionCount("input", "email", "redact", 1, team_id=8),
    ]


async def test_one_round_trip_writes_counts_only_and_keeps_them_a_year_and_a_day(
    redis: aioredis.Redis,
) -> None:
    store = DecisionCounts(redis, SetClock(NOW))
    await store.count(7, [Decision("output", "ssn", "redact", "choices.0"), redact("odd:check")])
    team_key, all_key = decisions_key(7, TODAY), decisions_key(ALL_TEAMS, TODAY)
    assert (team_key, all_key) == ("guardrails:7:2026-12", "guardrails:all:2026-12")  # a month per hash
    assert await redis.hgetall(team_key) == {
        b"2026-12-10:output:ssn:redact": b"1",
        b"2026-12-10:input:odd_check:redact": b"1",
    }
    assert await redis.hgetall(all_key) == {
        b"2026-12-10:7:output:ssn:redact": b"1",
        b"2026-12-10:7:input:odd_check:redact": b"1",
    }
    assert sorted(await redis.keys("*")) == sorted([team_key.encode(), all_key.encode()])
    for key in (team_key, all_key):
        ttl = await redis.ttl(key)
        assert KEEP_DAYS * 86_400 - 5 <= ttl <= KEEP_DAYS * 86_400
    # A colon in a name cannot break the field format.
    assert await store.team(7, TODAY, TODAY + timedelta(days=1)) == [
        DecisionCount("input", "odd_check", "redact", 1),
        DecisionCount("output", "ssn", "redact", 1),
    ]


async def test_a_range_is_read_only_where_days_are_kept(redis: aioredis.Redis) -> None:
    store = DecisionCounts(redis, SetClock(NOW))
    assert store.kept_since() == TODAY - timedelta(days=KEEP_DAYS - 1)
    # The day before the kept window, in a hash that has not expired yet (its month was written to
    # later): not counted, whatever the hash holds.
    before, first = store.kept_since() - timedelta(days=1), store.kept_since()
    await redis.hset(decisions_key(7, before), f"{before}:input:ssn:block", 5)
    await redis.hset(decisions_key(7, first), f"{first}:input:ssn:block", 1)
    assert await store.team(7, date(2020, 1, 1), TODAY + timedelta(days=1)) == [
        DecisionCount("input", "ssn", "block", 1)
    ]
    assert await store.team(7, date(2020, 1, 1), date(2020, 12, 31)) == []  # nothing kept: no read
    assert await store.team(7, TODAY + timedelta(days=1), TODAY + timedelta(days=30)) == []  # the future


async def test_fields_that_do_not_parse_are_ignored(redis: aioredis.Redis) -> None:
    store = DecisionCounts(redis, SetClock(NOW))
    today = TODAY.isoformat()
    team_fields = {
        f"{today}:input:ssn": 1,
        f"{today}:input:ssn:block": "x",
        f"{today}:a:b:c:d": 2,
        "input:ssn:block": 1,
        "2026-12-99:input:ssn:block": 1,
    }
    await redis.hset(decisions_key(7, TODAY), mapping=team_fields)
    all_fields = {f"{today}:x:input:ssn:block": 1, f"{today}:7:input:ssn": 1, f"{today}:input:ssn:block": 1}
    await redis.hset(decisions_key(ALL_TEAMS, TODAY), mapping=all_fields)
    day = (TODAY, TODAY + timedelta(days=1))
    assert await store.team(7, *day) == []
    assert await store.teams(*day) == []


async def test_redis_down_is_store_unavailable() -> None:
    client = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    try:
        store = DecisionCounts(client, SetClock(NOW))
        with pytest.raises(StoreUnavailable):
            await store.count(7, [redact("email")])
        with pytest.raises(StoreUnavailable):
            await store.team(7, TODAY, TODAY + timedelta(days=1))
        with pytest.raises(StoreUnavailable):
            await store.teams(TODAY, TODAY + timedelta(days=1))
    finally:
        await client.aclose()
