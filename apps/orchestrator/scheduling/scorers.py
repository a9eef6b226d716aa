"""The scorers live in `apps.core.scheduling` (shared with `llmfleet simulate`)."""

from apps.core.scheduling.scorers import LOCATION_RANK, load, location_rank

__all__ = ["LOCATION_RANK", "load", "location_rank"]
