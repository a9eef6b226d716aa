"""llmfleet core/quota."""
