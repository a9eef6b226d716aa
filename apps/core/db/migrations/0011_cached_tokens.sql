-- Cached input tokens (issue 29 item 4): prompt tokens the engine found in its prefix cache are
-- billed at the model's cached-input price. The price is recorded at reservation like the others
-- (NULL on rows reserved before this migration: their cached tokens cost the prompt price); the
-- count is the engine's `usage.prompt_tokens_details.cached_tokens`, never more than prompt_tokens.
-- The columns come without a table scan (a constant default); their checks are added NOT VALID here,
-- which checks every new row at once, and validated by 0013 in a transaction of its own, where the
-- scan of the existing rows takes a lock that lets reserves and settles go on.
ALTER TABLE usage_ledger ADD COLUMN cached_price_per_million BIGINT;
ALTER TABLE usage_ledger ADD COLUMN cached_prompt_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE usage_ledger ADD CONSTRAINT usage_ledger_cached_price_per_million_check
    CHECK (cached_price_per_million >= 0) NOT VALID;
ALTER TABLE usage_ledger ADD CONSTRAINT usage_ledger_cached_prompt_tokens_check
    CHECK (cached_prompt_tokens >= 0 AND cached_prompt_tokens <= prompt_tokens) NOT VALID;
