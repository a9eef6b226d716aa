"""llmfleet orchestrator."""
