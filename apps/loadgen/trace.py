"""`--record-trace FILE`: the run as a load trace `llmfleet simulate --trace FILE` replays.

One JSON line per request, the fields of the simulator's trace format: `t` (arrival, seconds from
the first), `model`, `team`, `prompt_tokens`, `max_tokens`, `answer_tokens` (what the engine
produced; a request that failed before any token is recorded with its `max_tokens`, the most it
could have asked for). Token counts only: no prompt or completion text is ever written.
"""

from __future__ import annotations

import json
from pathlib import Path

from apps.core.errors import SpecError
from apps.loadgen.config import LoadConfig
from apps.loadgen.report import LoadReport


def trace_rows(report: LoadReport, config: LoadConfig) -> list[dict[str, object]]:
    results = sorted(report.results, key=lambda r: r.start)
    t0 = results[0].start if results else 0.0
    team = config.tag or "loadgen"
    return [
        {
            "t": round(r.start - t0, 6),
            "model": config.model,
            "team": team,
            "prompt_tokens": r.prompt_tokens or config.prompt_tokens,
            "max_tokens": config.max_tokens,
            "answer_tokens": r.output_tokens if r.output_tokens > 0 else config.max_tokens,
        }
        for r in results
    ]


def write_trace(path: str, report: LoadReport, config: LoadConfig) -> None:
    lines = "".join(json.dumps(row) + "\n" for row in trace_rows(report, config))
    try:
        Path(path).write_text(lines, encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"--record-trace {path}: {exc.strerror}", param="record_trace") from None
