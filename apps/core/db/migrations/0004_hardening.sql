-- Hardening (issue 21): node tokens carry what a node may register; team names are validated.
-- Idempotent: safe to apply twice.

-- The models a node (or every member of a pool) may register. NULL: a token issued before this
-- migration (any model of the catalog, as before); re-issue it to restrict it.
ALTER TABLE node_tokens ADD COLUMN IF NOT EXISTS models text[];

-- Team names: 1-64 of [A-Za-z0-9._-], starting with a letter or digit; unique regardless of case
-- (so "Team-A" cannot shadow "team-a" in a listing). All-digit names are allowed: every API says
-- explicitly whether it means a team id (`team_id`, an integer) or a name (`team`).
-- NOT VALID: enforced for new and renamed teams without failing on rows written before.
DO $$ BEGIN
    ALTER TABLE teams ADD CONSTRAINT teams_name_valid
        CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$') NOT VALID;
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;
CREATE UNIQUE INDEX IF NOT EXISTS teams_name_lower ON teams (lower(name));
