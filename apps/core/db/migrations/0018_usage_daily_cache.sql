-- The console's response cache panel (docs/console.md) reads the daily rollup, like the usage charts: per
-- team, UTC day, model and key, the requests the response cache answered (`usage_ledger.cache = 'hit'`,
-- 0017), those it looked up and the fleet answered ('miss'), the hits' completion tokens and cost, and the
-- semantic lookups' question embeddings (ledger rows `<request id>:cache-embed`, on the embedding model,
-- billed to the team). The trigger of 0012 with these columns: it adds them in the settle's own statement.
ALTER TABLE usage_daily ADD COLUMN IF NOT EXISTS cache_hits BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage_daily ADD COLUMN IF NOT EXISTS cache_misses BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage_daily ADD COLUMN IF NOT EXISTS cache_hit_completion_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage_daily ADD COLUMN IF NOT EXISTS cache_hit_cost_microcredits BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage_daily ADD COLUMN IF NOT EXISTS cache_lookups BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage_daily ADD COLUMN IF NOT EXISTS cache_lookup_cost_microcredits BIGINT NOT NULL DEFAULT 0;
-- The admin view reads every team's cache use over a range of days: only the rows the cache took part in.
CREATE INDEX IF NOT EXISTS usage_daily_cache_day ON usage_daily (day)
    WHERE cache_hits > 0 OR cache_misses > 0 OR cache_lookups > 0;

CREATE OR REPLACE FUNCTION usage_daily_on_settle() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    hit INTEGER := CASE WHEN NEW.cache = 'hit' THEN 1 ELSE 0 END;
    miss INTEGER := CASE WHEN NEW.cache = 'miss' THEN 1 ELSE 0 END;
    lookup INTEGER := CASE WHEN NEW.request_id LIKE '%:cache-embed' THEN 1 ELSE 0 END;
BEGIN
    INSERT INTO usage_daily AS u (team_id, day, model, key_id, requests, prompt_tokens,
                                  completion_tokens, cost_microcredits, last_at, cached_prompt_tokens,
                                  cache_hits, cache_misses, cache_hit_completion_tokens,
                                  cache_hit_cost_microcredits, cache_lookups, cache_lookup_cost_microcredits)
    VALUES (NEW.team_id, (NEW.created_at AT TIME ZONE 'UTC')::date, NEW.model, COALESCE(NEW.key_id, 0),
            1, NEW.prompt_tokens, NEW.completion_tokens, NEW.cost_microcredits, NEW.created_at,
            NEW.cached_prompt_tokens, hit, miss, hit * NEW.completion_tokens, hit * NEW.cost_microcredits,
            lookup, lookup * NEW.cost_microcredits)
    ON CONFLICT (team_id, day, model, key_id) DO UPDATE SET
        requests = u.requests + 1,
        prompt_tokens = u.prompt_tokens + EXCLUDED.prompt_tokens,
        completion_tokens = u.completion_tokens + EXCLUDED.completion_tokens,
        cost_microcredits = u.cost_microcredits + EXCLUDED.cost_microcredits,
        cached_prompt_tokens = u.cached_prompt_tokens + EXCLUDED.cached_prompt_tokens,
        cache_hits = u.cache_hits + EXCLUDED.cache_hits,
        cache_misses = u.cache_misses + EXCLUDED.cache_misses,
        cache_hit_completion_tokens = u.cache_hit_completion_tokens + EXCLUDED.cache_hit_completion_tokens,
        cache_hit_cost_microcredits = u.cache_hit_cost_microcredits + EXCLUDED.cache_hit_cost_microcredits,
        cache_lookups = u.cache_lookups + EXCLUDED.cache_lookups,
        cache_lookup_cost_microcredits = u.cache_lookup_cost_microcredits + EXCLUDED.cache_lookup_cost_microcredits,
        last_at = GREATEST(u.last_at, EXCLUDED.last_at);
    RETURN NULL;
END $$;

-- Rows settled before this migration (since 0017): their cache counts from the ledger, once (idempotent: the
-- trigger keeps the two equal from here on, so a second run sets the same values). Only the rows the cache
-- took part in are read; every other rollup row keeps its zeros, which are right.
UPDATE usage_daily AS u SET
    cache_hits = s.hits, cache_misses = s.misses, cache_hit_completion_tokens = s.hit_tokens,
    cache_hit_cost_microcredits = s.hit_cost, cache_lookups = s.lookups, cache_lookup_cost_microcredits = s.lookup_cost
FROM (
    SELECT team_id, (created_at AT TIME ZONE 'UTC')::date AS day, model, COALESCE(key_id, 0) AS key_id,
           count(*) FILTER (WHERE cache = 'hit') AS hits,
           count(*) FILTER (WHERE cache = 'miss') AS misses,
           COALESCE(SUM(completion_tokens) FILTER (WHERE cache = 'hit'), 0) AS hit_tokens,
           COALESCE(SUM(cost_microcredits) FILTER (WHERE cache = 'hit'), 0) AS hit_cost,
           count(*) FILTER (WHERE request_id LIKE '%:cache-embed') AS lookups,
           COALESCE(SUM(cost_microcredits) FILTER (WHERE request_id LIKE '%:cache-embed'), 0) AS lookup_cost
    FROM usage_ledger
    WHERE status = 'settled' AND (cache IS NOT NULL OR request_id LIKE '%:cache-embed')
    GROUP BY 1, 2, 3, 4
) AS s
WHERE u.team_id = s.team_id AND u.day = s.day AND u.model = s.model AND u.key_id = s.key_id;
