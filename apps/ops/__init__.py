"""`llmfleet ops`: the daily ledger-drift check and the weekly cost review."""
