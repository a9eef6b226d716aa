-- A stream resumed on another node after its node was lost (apps/orchestrator/resume.py): the
-- prompt tokens the second node prefilled (the prompt and the text already delivered). Platform
-- cost, recorded on the request's row and never charged: the team pays its prompt once and the
-- completion tokens it received (prompt_tokens / completion_tokens / cost_microcredits).
ALTER TABLE usage_ledger ADD COLUMN resume_prompt_tokens INTEGER NOT NULL DEFAULT 0
    CHECK (resume_prompt_tokens >= 0);
