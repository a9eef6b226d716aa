-- Node pools: one token admits every node id `<pool>/<instance>` (EKS pods, whose names are
-- not known in advance). `kind` says whether a token row is a single node or a pool; node and
-- pool ids never contain '/', which is what makes `<pool>/<instance>` unambiguous.
-- Idempotent: safe to apply twice.

ALTER TABLE node_tokens ADD COLUMN IF NOT EXISTS kind text NOT NULL DEFAULT 'node';

DO $$ BEGIN
    ALTER TABLE node_tokens ADD CONSTRAINT node_tokens_kind CHECK (kind IN ('node', 'pool'));
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

-- NOT VALID: enforced for every new or updated row without failing on rows written before.
DO $$ BEGIN
    ALTER TABLE node_tokens ADD CONSTRAINT node_tokens_id_no_slash CHECK (strpos(node_id, '/') = 0) NOT VALID;
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;
