"""The filters live in `apps.core.scheduling` (shared with `llmfleet simulate`)."""

from apps.core.scheduling.filters import (
    DEFAULT_FILTERS,
    Filter,
    has_free_seq,
    kv_headroom,
    not_excluded,
    of_revision,
    routable,
    serves_model,
)

__all__ = [
    "DEFAULT_FILTERS",
    "Filter",
    "has_free_seq",
    "kv_headroom",
    "not_excluded",
    "of_revision",
    "routable",
    "serves_model",
]
