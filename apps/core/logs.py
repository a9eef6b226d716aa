"""The one JSON-lines log format of every llmfleet process (never prompts or completions).

One object per line on stderr: `ts` (ISO-8601 UTC with milliseconds), `level` (lower case),
`logger`, `msg`, then every `extra=` field of the call, and `exc` for an exception.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

# The attributes every LogRecord has: an `extra` field of one of these names would be refused.
RESERVED = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in RESERVED and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def safe_extra(fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` usable as `extra=`: a name a LogRecord already has gets a trailing `_`."""
    return {(f"{k}_" if k in RESERVED else k): v for k, v in fields.items()}


def setup_json_logging(level: int | str = logging.INFO, logger: str = "", *, propagate: bool = True) -> None:
    """JSON lines on stderr for `logger` (the root logger by default)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    target = logging.getLogger(logger)
    target.handlers[:] = [handler]
    target.setLevel(level.upper() if isinstance(level, str) else level)
    target.propagate = propagate
