-- Console sessions (issue 27): the SHA-256 of each session's id, so sign-out revokes it on the
-- server (the signed cookie alone no longer proves a session) and an expired row is worthless.
-- Idempotent: safe to apply twice.
CREATE TABLE IF NOT EXISTS console_sessions (
    id_sha256   TEXT PRIMARY KEY,
    expires_at  TIMESTAMPTZ NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS console_sessions_expires_at ON console_sessions (expires_at);
