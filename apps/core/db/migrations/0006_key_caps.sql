-- Per-key request caps (issue 15: the brief's "cap max_tokens and context per key") and the quota
-- subject of every reservation. Idempotent: safe to apply twice.

-- The most completion tokens one request of the key may ask for (`max_tokens` /
-- `max_completion_tokens`, per choice), and the longest context (prompt bound + max_tokens) it may
-- use. NULL: no cap beyond the model's own `max_model_len`.
ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS max_tokens INTEGER;
ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS max_context INTEGER;
DO $$ BEGIN
    ALTER TABLE api_keys ADD CONSTRAINT api_keys_max_tokens_positive CHECK (max_tokens IS NULL OR max_tokens > 0);
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;
DO $$ BEGIN
    ALTER TABLE api_keys ADD CONSTRAINT api_keys_max_context_positive CHECK (max_context IS NULL OR max_context > 0);
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

-- Whose daily token quota (`tpd:{subject}:{day}`) the settle counts: the admission's subject (the
-- key id, or `jwt-<sub>` for a JWT caller, who has no key id). NULL (a row reserved before this
-- migration): the key id, as before.
ALTER TABLE usage_ledger ADD COLUMN IF NOT EXISTS quota_subject TEXT;
