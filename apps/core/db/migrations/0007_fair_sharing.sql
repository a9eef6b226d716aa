-- Fair sharing (issue 19): a team's weight in the orchestrators' weighted fair queue, its limits
-- on top of its keys' (concurrent streams, tokens per minute; NULL: none), and the priority class of a key (`interactive`, the default, or `batch`: served only from capacity
-- interactive traffic leaves free, and passed to vLLM's per-request `priority`).
-- Idempotent: safe to apply twice.

ALTER TABLE teams ADD COLUMN IF NOT EXISTS weight DOUBLE PRECISION NOT NULL DEFAULT 1;
DO $$ BEGIN
    ALTER TABLE teams ADD CONSTRAINT teams_weight_positive CHECK (weight > 0 AND weight <= 1000);
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

ALTER TABLE teams ADD COLUMN IF NOT EXISTS max_streams INTEGER CHECK (max_streams > 0);
ALTER TABLE teams ADD COLUMN IF NOT EXISTS tokens_per_minute BIGINT CHECK (tokens_per_minute > 0);

ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS priority_class TEXT NOT NULL DEFAULT 'interactive';
DO $$ BEGIN
    ALTER TABLE api_keys ADD CONSTRAINT api_keys_priority_class_known
        CHECK (priority_class IN ('interactive', 'batch'));
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;
