"""llmfleet enginesim."""
