-- The priority classes a team may use for the keys it creates itself in the console (issue 27):
-- the admin's decision (`POST /admin/teams`, `/admin/teams/sharing`, field `priority_classes`).
-- Existing and new teams keep both classes unless the admin narrows them (a team meant to be
-- batch: `["batch"]`). Idempotent: safe to apply twice.
ALTER TABLE teams ADD COLUMN IF NOT EXISTS priority_classes TEXT[] NOT NULL
    DEFAULT ARRAY['interactive', 'batch']::TEXT[];
DO $$ BEGIN
    ALTER TABLE teams ADD CONSTRAINT teams_priority_classes_known
        CHECK (cardinality(priority_classes) >= 1
               AND priority_classes <@ ARRAY['interactive', 'batch']::TEXT[]);
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;
