"""Orchestrator events as JSON lines (`apps.core.logs`; never prompts or completions: ids, nodes, counts)."""

from __future__ import annotations

import logging
from typing import Any

from apps.core.logs import safe_extra, setup_json_logging

log = logging.getLogger("llmfleet.orchestrator")


def event(name: str, level: int = logging.INFO, **fields: Any) -> None:
    """One log line named `name` (also its `event` field) with `fields`."""
    if log.isEnabledFor(level):
        log.log(level, name, extra={"event": name, **safe_extra(fields)})


def configure(level: str = "INFO") -> None:
    setup_json_logging(level, "llmfleet", propagate=False)
