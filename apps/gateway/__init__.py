"""llmfleet gateway."""
