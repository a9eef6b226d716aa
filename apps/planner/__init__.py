"""llmfleet planner."""
