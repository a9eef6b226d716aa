"""The `llmfleet` command: the composition root that dispatches to each app's CLI module."""
