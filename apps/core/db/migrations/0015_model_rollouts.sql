-- Canary by model revision (issue 30 item 3): a model's live revisions and the share of
-- conversations its canary takes. One row per model with a rollout; without a row every node of the
-- model serves it, whatever its revision. `retired_revision`: the last one rolled back, kept out of
-- traffic. The events are the history `llmfleet model status` prints and the audit reads: who did
-- what, when, and why (an automatic rollback says which bound the canary broke).
CREATE TABLE model_rollouts (
    model TEXT PRIMARY KEY,
    stable_revision TEXT NOT NULL CHECK (stable_revision <> ''),
    canary_revision TEXT CHECK (canary_revision <> ''),
    weight_percent NUMERIC(5, 2) NOT NULL DEFAULT 0 CHECK (weight_percent >= 0 AND weight_percent <= 100),
    retired_revision TEXT,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK (canary_revision IS NULL OR canary_revision <> stable_revision),
    CHECK (canary_revision IS NOT NULL OR weight_percent = 0)
);

CREATE TABLE model_rollout_events (
    id BIGSERIAL PRIMARY KEY,
    model TEXT NOT NULL,
    at TIMESTAMPTZ NOT NULL DEFAULT now(),
    action TEXT NOT NULL CHECK (action IN ('canary', 'promote', 'rollback')),
    revision TEXT NOT NULL,
    weight_percent NUMERIC(5, 2),
    actor TEXT NOT NULL,
    reason TEXT
);
CREATE INDEX model_rollout_events_model_at ON model_rollout_events (model, at);
