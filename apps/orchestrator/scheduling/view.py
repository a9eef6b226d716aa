"""The scheduler's values live in `apps.core.scheduling` (shared with `llmfleet simulate`)."""

from apps.core.scheduling.view import NodeView, PickRequest

__all__ = ["NodeView", "PickRequest"]
