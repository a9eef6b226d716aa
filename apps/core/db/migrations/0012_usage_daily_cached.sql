-- The console's daily rollup counts cached prompt tokens too (0011): the trigger of 0005, with the
-- new column.
ALTER TABLE usage_daily ADD COLUMN IF NOT EXISTS cached_prompt_tokens BIGINT NOT NULL DEFAULT 0;
CREATE OR REPLACE FUNCTION usage_daily_on_settle() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO usage_daily AS u (team_id, day, model, key_id, requests, prompt_tokens,
                                  completion_tokens, cost_microcredits, last_at, cached_prompt_tokens)
    VALUES (NEW.team_id, (NEW.created_at AT TIME ZONE 'UTC')::date, NEW.model, COALESCE(NEW.key_id, 0),
            1, NEW.prompt_tokens, NEW.completion_tokens, NEW.cost_microcredits, NEW.created_at,
            NEW.cached_prompt_tokens)
    ON CONFLICT (team_id, day, model, key_id) DO UPDATE SET
        requests = u.requests + 1,
        prompt_tokens = u.prompt_tokens + EXCLUDED.prompt_tokens,
        completion_tokens = u.completion_tokens + EXCLUDED.completion_tokens,
        cost_microcredits = u.cost_microcredits + EXCLUDED.cost_microcredits,
        cached_prompt_tokens = u.cached_prompt_tokens + EXCLUDED.cached_prompt_tokens,
        last_at = GREATEST(u.last_at, EXCLUDED.last_at);
    RETURN NULL;
END $$;

-- Rows settled before this migration: their cached tokens from the ledger, once (idempotent: the
-- trigger keeps the two equal from here on, so a second run sets the same values).
UPDATE usage_daily AS u SET cached_prompt_tokens = s.cached
FROM (
    SELECT team_id, (created_at AT TIME ZONE 'UTC')::date AS day, model, COALESCE(key_id, 0) AS key_id,
           SUM(cached_prompt_tokens) AS cached
    FROM usage_ledger WHERE status = 'settled' GROUP BY 1, 2, 3, 4
) AS s
WHERE u.team_id = s.team_id AND u.day = s.day AND u.model = s.model AND u.key_id = s.key_id
  AND u.cached_prompt_tokens <> s.cached;
