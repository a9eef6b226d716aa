"""The API key cache against real PostgreSQL: one lookup per key at a time, refresh ahead of expiry,
and expiry (so revocation) unchanged."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from psycopg_pool import AsyncConnectionPool

from apps.core.errors import AuthenticationFailed
from apps.core.identity.keys import KeyStore
from apps.core.ledger.teams import TeamStore

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def pool(migrated_db_url: str) -> AsyncIterator[AsyncConnectionPool]:
    async with AsyncConnectionPool(migrated_db_url, min_size=1, max_size=8) as p:
        yield p


async def settle_background(store: KeyStore) -> None:
    """Wait for lookups the store started on its own (the refresh-ahead task)."""
    pending = list(store._loading.values())
    if pending:
        await asyncio.wait(pending)


async def test_concurrent_misses_share_one_lookup(pool: AsyncConnectionPool) -> None:
    team = await TeamStore(pool).create_team("t")
    store = KeyStore(pool, b"s")
    secret, record = await store.create(team=team.id)
    principals = await asyncio.gather(*(store.authenticate(secret) for _ in range(50)))
    assert {p.key_id for p in principals} == {record.id}
    assert store.db_lookups == 1
    unknown = await asyncio.gather(
        *(store.authenticate("sk-lf-" + "x" * 40) for _ in range(20)), return_exceptions=True
    )
    assert all(isinstance(e, AuthenticationFailed) for e in unknown)
    assert store.db_lookups == 2


async def test_a_key_in_use_is_refreshed_in_the_background_before_it_expires(
    pool: AsyncConnectionPool,
) -> None:
    clock = [100.0]
    team = await TeamStore(pool).create_team("t")
    store = KeyStore(pool, b"s", cache_ttl_s=4.0, monotonic=lambda: clock[0])
    secret, _ = await store.create(team=team.id)
    await store.authenticate(secret)
    assert store.db_lookups == 1
    clock[0] += 2.0  # fresh: served from the cache, nothing started
    await store.authenticate(secret)
    assert store.db_lookups == 1
    assert not store._loading
    clock[0] += 1.5  # last quarter of the TTL: served now, re-read in the background
    await store.authenticate(secret)
    await settle_background(store)
    assert store.db_lookups == 2
    clock[0] += 3.9  # within the refreshed entry's TTL (read at 103.5): no lookup on the request path
    await store.authenticate(secret)
    assert store.db_lookups == 2


async def test_revocation_still_wins_within_the_ttl_while_refreshing(pool: AsyncConnectionPool) -> None:
    clock = [100.0]
    team = await TeamStore(pool).create_team("t")
    replica = KeyStore(pool, b"s", cache_ttl_s=4.0, monotonic=lambda: clock[0])
    admin = KeyStore(pool, b"s")
    secret, record = await admin.create(team=team.id)
    await replica.authenticate(secret)
    assert await admin.revoke(record.id)
    clock[0] += 3.5  # the entry is still valid: served, and the background refresh reads the revocation
    await replica.authenticate(secret)
    await settle_background(replica)
    with pytest.raises(AuthenticationFailed):
        await replica.authenticate(secret)  # at 3.5 s, before the old entry's 4 s TTL


async def test_a_failed_refresh_only_lets_the_entry_expire(pool: AsyncConnectionPool) -> None:
    clock = [100.0]
    team = await TeamStore(pool).create_team("t")
    store = KeyStore(pool, b"s", cache_ttl_s=4.0, monotonic=lambda: clock[0])
    secret, record = await store.create(team=team.id)
    await store.authenticate(secret)
    real_load = store._load

    async def failing(digest: str) -> None:
        raise OSError("database gone")

    store._load = failing  # type: ignore[method-assign]
    clock[0] += 3.5
    assert (await store.authenticate(secret)).key_id == record.id  # served; the refresh fails quietly
    await settle_background(store)
    clock[0] += 1.0  # expired, and the database is still gone: the request sees the failure
    with pytest.raises(OSError, match="database gone"):
        await store.authenticate(secret)
    store._load = real_load  # type: ignore[method-assign]
    assert (await store.authenticate(secret)).key_id == record.id
