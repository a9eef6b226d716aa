-- Guardrail policies (issue 31 item 3): one per team, the JSON document the admin API validated
-- (apps/core/guardrails/policy.py, docs/guardrails.md). Only the policy is stored: never a prompt, an
-- answer or anything a check matched. A team's policy goes with the team.
CREATE TABLE IF NOT EXISTS guardrail_policies (
    team_id     BIGINT PRIMARY KEY REFERENCES teams(id) ON DELETE CASCADE,
    policy      JSONB NOT NULL CHECK (jsonb_typeof(policy) = 'object'),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
