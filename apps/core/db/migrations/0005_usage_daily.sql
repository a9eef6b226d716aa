-- Usage rollups for the console: one row per (team, UTC day, model, key), maintained by a
-- trigger in the same transaction as the settle that finalises a ledger row, so the rollup
-- can never disagree with the ledger (same totals for any whole-day range) and no sweeper
-- lag shows on the pages. `key_id` 0 = a request made with a JWT (no key).
-- Idempotent: safe to apply twice.

CREATE TABLE IF NOT EXISTS usage_daily (
    team_id            BIGINT NOT NULL REFERENCES teams(id),
    day                DATE NOT NULL,
    model              TEXT NOT NULL,
    key_id             BIGINT NOT NULL DEFAULT 0,
    requests           BIGINT NOT NULL DEFAULT 0,
    prompt_tokens      BIGINT NOT NULL DEFAULT 0,
    completion_tokens  BIGINT NOT NULL DEFAULT 0,
    cost_microcredits  BIGINT NOT NULL DEFAULT 0,
    last_at            TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (team_id, day, model, key_id)
);
-- The admin's all-teams view and "last used" per key.
CREATE INDEX IF NOT EXISTS usage_daily_key ON usage_daily (key_id, last_at) WHERE key_id <> 0;

-- Day of a request = the UTC day of its ledger row's created_at (what `/v1/usage?group_by=day` uses).
CREATE OR REPLACE FUNCTION usage_daily_on_settle() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO usage_daily AS u (team_id, day, model, key_id, requests, prompt_tokens,
                                  completion_tokens, cost_microcredits, last_at)
    VALUES (NEW.team_id, (NEW.created_at AT TIME ZONE 'UTC')::date, NEW.model, COALESCE(NEW.key_id, 0),
            1, NEW.prompt_tokens, NEW.completion_tokens, NEW.cost_microcredits, NEW.created_at)
    ON CONFLICT (team_id, day, model, key_id) DO UPDATE SET
        requests = u.requests + 1,
        prompt_tokens = u.prompt_tokens + EXCLUDED.prompt_tokens,
        completion_tokens = u.completion_tokens + EXCLUDED.completion_tokens,
        cost_microcredits = u.cost_microcredits + EXCLUDED.cost_microcredits,
        last_at = GREATEST(u.last_at, EXCLUDED.last_at);
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS usage_daily_settle ON usage_ledger;
CREATE TRIGGER usage_daily_settle AFTER UPDATE OF status ON usage_ledger
    FOR EACH ROW WHEN (OLD.status = 'reserved' AND NEW.status = 'settled')
    EXECUTE FUNCTION usage_daily_on_settle();

-- Rows settled before this migration (an upgrade): rebuilt from the ledger once.
INSERT INTO usage_daily (team_id, day, model, key_id, requests, prompt_tokens, completion_tokens,
                         cost_microcredits, last_at)
SELECT team_id, (created_at AT TIME ZONE 'UTC')::date, model, COALESCE(key_id, 0), count(*),
       SUM(prompt_tokens), SUM(completion_tokens), SUM(cost_microcredits), max(created_at)
FROM usage_ledger WHERE status = 'settled'
GROUP BY 1, 2, 3, 4
ON CONFLICT (team_id, day, model, key_id) DO NOTHING;

-- One-time console sign-in links (`llmfleet dev`): the SHA-256 of each link's token once used.
CREATE TABLE IF NOT EXISTS console_signin_used (
    token_sha256  TEXT PRIMARY KEY,
    used_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);
