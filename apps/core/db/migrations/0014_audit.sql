-- The audit trail per request (issue 30 item 4): the node whose report settled the row and the model
-- revision that node served (what the assignment recorded: `req:{id}`.revision). NULL on rows settled
-- before this migration, on rows cancelled (nothing ran) and when an older node did not say its
-- revision. Never content: the ledger holds counts and money only. Both columns come without a table
-- scan (no default, no check).
ALTER TABLE usage_ledger ADD COLUMN node_id TEXT;
ALTER TABLE usage_ledger ADD COLUMN model_revision TEXT;
