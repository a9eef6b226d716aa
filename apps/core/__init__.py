"""llmfleet core."""
