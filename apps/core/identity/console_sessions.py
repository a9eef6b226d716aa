"""Console sessions held on the server: a session is alive while its row is (issue 27).

The console's cookie names a random session id (signed, with its expiry); this table holds only
the id's SHA-256 and the expiry. Sign-out deletes the row, so a saved copy of the cookie, and the
CSRF token derived from it, stop working everywhere at once. Expired rows are swept at sign-in.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

from psycopg_pool import AsyncConnectionPool


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class ConsoleSessions:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool

    async def open(self, session_id: str, expires: int) -> None:
        """Record a new session (and sweep the expired ones)."""
        async with self._pool.connection() as conn:
            await conn.execute("DELETE FROM console_sessions WHERE expires_at < now()")
            await conn.execute(
                "INSERT INTO console_sessions (id_sha256, expires_at) VALUES (%s, %s)",
                (_digest(session_id), datetime.fromtimestamp(expires, UTC)),
            )

    async def alive(self, session_id: str) -> bool:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT 1 FROM console_sessions WHERE id_sha256 = %s AND expires_at > now()",
                (_digest(session_id),),
            )
            return await cur.fetchone() is not None

    async def revoke(self, session_id: str) -> None:
        async with self._pool.connection() as conn:
            await conn.execute("DELETE FROM console_sessions WHERE id_sha256 = %s", (_digest(session_id),))
