"""llmfleet agent."""
