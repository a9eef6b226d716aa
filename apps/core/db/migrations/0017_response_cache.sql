-- The response cache (issue 31 item 2, docs/response-cache.md): opt-in per team and model.
--
-- `response_cache_policies`: the admin's settings of a team (the JSON document the admin API validated,
-- apps/core/respcache/policy.py). `response_cache_keys`: the random salt from which the team's encryption
-- key is derived (HKDF over the gateway's secret key): deleting it makes every entry of the team unreadable.
-- `response_cache`: the entries, the answer encrypted (AES-256-GCM) with the team's key, never in clear; an
-- expired entry is never served and is deleted by the gateways' janitor within a minute or so.
-- Everything of a team goes with the team (ON DELETE CASCADE). The ledger marks each request's cache use.
CREATE TABLE IF NOT EXISTS response_cache_policies (
    team_id     BIGINT PRIMARY KEY REFERENCES teams(id) ON DELETE CASCADE,
    policy      JSONB NOT NULL CHECK (jsonb_typeof(policy) = 'object'),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS response_cache_keys (
    team_id       BIGINT PRIMARY KEY REFERENCES teams(id) ON DELETE CASCADE,
    salt          BYTEA NOT NULL CHECK (length(salt) = 32),
    -- The team's stored bytes, kept by each write and recomputed exactly at each eviction (the size bound).
    stored_bytes  BIGINT NOT NULL DEFAULT 0,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS response_cache (
    id                 BIGSERIAL PRIMARY KEY,
    team_id            BIGINT NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
    model              TEXT NOT NULL,
    revision           TEXT NOT NULL,
    endpoint           TEXT NOT NULL CHECK (endpoint IN ('chat', 'completions')),
    exact_key          BYTEA NOT NULL,   -- HMAC of the normalised request under the team's key
    context_key        BYTEA NOT NULL,   -- the same without the last user turn (the semantic match's scope)
    embed_model        TEXT,             -- the model that embedded the last user turn (NULL: exact only)
    sealed             BYTEA NOT NULL,   -- nonce || AES-GCM(answer)
    bytes              INTEGER NOT NULL CHECK (bytes > 0),
    prompt_tokens      INTEGER NOT NULL CHECK (prompt_tokens >= 0),
    completion_tokens  INTEGER NOT NULL CHECK (completion_tokens >= 0),
    hits               BIGINT NOT NULL DEFAULT 0,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at         TIMESTAMPTZ NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS response_cache_exact ON response_cache (team_id, model, revision, exact_key);
CREATE INDEX IF NOT EXISTS response_cache_context ON response_cache (team_id, model, revision, context_key);
CREATE INDEX IF NOT EXISTS response_cache_expiry ON response_cache (expires_at);

-- The semantic match needs pgvector (the embedded PostgreSQL of `llmfleet dev` and Aurora ship it). Where the
-- server has no `vector` extension the column is not created and the cache matches exactly only (the admin
-- API refuses a semantic threshold there with a 409 `semantic_cache_unavailable`).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'vector') THEN
        CREATE EXTENSION IF NOT EXISTS vector;
        ALTER TABLE response_cache ADD COLUMN IF NOT EXISTS embedding vector;
    END IF;
END
$$;

-- Each request's use of the cache: 'hit' (answered from it, billed at the cache price), 'miss' (looked up,
-- answered by the fleet), NULL (the cache was not asked: off for the team and model, or not cacheable).
-- Every existing row is NULL (valid by construction): the check is added NOT VALID, so no scan of the ledger.
ALTER TABLE usage_ledger ADD COLUMN IF NOT EXISTS cache TEXT;
ALTER TABLE usage_ledger ADD CONSTRAINT usage_ledger_cache_check CHECK (cache IN ('hit', 'miss')) NOT VALID;
