"""llmfleet loadgen."""
