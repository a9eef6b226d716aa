"""The picker lives in `apps.core.scheduling` (shared with `llmfleet simulate`)."""

from apps.core.scheduling.picker import candidates, rank, serving_anywhere

__all__ = ["candidates", "rank", "serving_anywhere"]
