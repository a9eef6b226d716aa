"""JSON-lines logging for the orchestrator (never prompts or completions: ids, nodes, counts)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

log = logging.getLogger("llmfleet.orchestrator")


def event(name: str, level: int = logging.INFO, **fields: Any) -> None:
    if log.isEnabledFor(level):
        log.log(level, json.dumps({"ts": round(time.time(), 3), "event": name, **fields}, default=str))


def configure(level: str = "INFO") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("llmfleet")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
