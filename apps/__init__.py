"""llmfleet services and their shared kernel (`apps.core`)."""
