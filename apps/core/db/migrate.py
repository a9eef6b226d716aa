"""Versioned SQL migrations: `apps/core/db/migrations/*.sql`, applied in name order.

Each file runs in its own transaction and is recorded in `schema_migrations`; a
PostgreSQL advisory lock serialises concurrent starters (several gateway replicas,
`llmfleet dev` and `llmfleet admin migrate` at once), so each file is applied exactly
once. Returns the names applied by this call (empty when up to date).
"""

from __future__ import annotations

from pathlib import Path

import psycopg

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Arbitrary constant shared by every llmfleet process: "llmfleet" in ASCII, truncated to bigint.
ADVISORY_LOCK_ID = 0x6C6C6D666C656574

_CREATE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    name TEXT PRIMARY KEY,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)
"""


def migration_files(directory: Path = MIGRATIONS_DIR) -> list[Path]:
    return sorted(directory.glob("*.sql"), key=lambda p: p.name)


def migrate_sync(url: str, directory: Path = MIGRATIONS_DIR) -> list[str]:
    applied: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (ADVISORY_LOCK_ID,))
        try:
            conn.execute(_CREATE)
            done = {row[0] for row in conn.execute("SELECT name FROM schema_migrations").fetchall()}
            for path in migration_files(directory):
                if path.name in done:
                    continue
                sql = path.read_text(encoding="utf-8")
                with conn.transaction():
                    conn.execute(sql.encode())
                    conn.execute("INSERT INTO schema_migrations (name) VALUES (%s)", (path.name,))
                applied.append(path.name)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (ADVISORY_LOCK_ID,))
    return applied


async def migrate(url: str, directory: Path = MIGRATIONS_DIR) -> list[str]:
    applied: list[str] = []
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("SELECT pg_advisory_lock(%s)", (ADVISORY_LOCK_ID,))
        try:
            await conn.execute(_CREATE)
            cur = await conn.execute("SELECT name FROM schema_migrations")
            done = {row[0] for row in await cur.fetchall()}
            for path in migration_files(directory):
                if path.name in done:
                    continue
                sql = path.read_text(encoding="utf-8")
                async with conn.transaction():
                    await conn.execute(sql.encode())
                    await conn.execute("INSERT INTO schema_migrations (name) VALUES (%s)", (path.name,))
                applied.append(path.name)
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (ADVISORY_LOCK_ID,))
    return applied
